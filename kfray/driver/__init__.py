"""Running a search: the coordinator (actors and the database), the thin Ray loop, and the pure
ledger that keeps the books (admission, budget, batches, replay)."""
from kfray.driver.coordinator import Coordinator, default_run_dir, resume_search, run_search
from kfray.driver.ledger import TaskLedger

__all__ = ["Coordinator", "TaskLedger", "default_run_dir", "resume_search", "run_search"]
