"""Evaluators a test file keeps between its `verify` calls (verify's `judges`): a judge and its
zygote are started once per file, not once per kernel. conftest shuts them down after each file."""
JUDGES: dict = {}


def shut_all() -> None:
    for ev in JUDGES.values():
        ev.shutdown()
    JUDGES.clear()
