"""Errors a user can act on. The CLI prints them as one line, without a traceback."""


class KfrayError(Exception):
    """Base class: the message says what is wrong, where, and how to fix it."""


class ConfigError(KfrayError):
    pass


class TaskError(KfrayError):
    pass


class BackendError(KfrayError):
    pass


class RunStopped(KfrayError):
    """A run ended early by a signal (SIGTERM, Ctrl-C): what finished is recorded, it can resume."""

    def __init__(self, message: str, signal_name: str = "SIGTERM"):
        super().__init__(message)
        self.signal_name = signal_name

    @property
    def exit_code(self) -> int:
        import signal
        return 128 + int(getattr(signal, self.signal_name, signal.SIGTERM))
