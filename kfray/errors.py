"""Errors a user can act on. The CLI prints them as one line, without a traceback."""


class KfrayError(Exception):
    """Base class: the message says what is wrong, where, and how to fix it."""


class ConfigError(KfrayError):
    pass


class TaskError(KfrayError):
    pass


class BackendError(KfrayError):
    pass
