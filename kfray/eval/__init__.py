"""Evaluation: compile, check and time one candidate (backends, sandbox, measurement, the suites'
own harness, the evaluator actor and its queue)."""

__all__: list[str] = []       # modules are imported by name: kfray.eval.evaluator, .measure, ...
