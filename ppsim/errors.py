"""The one exception type users see: a message naming the field and how to fix it."""


class PPSimError(ValueError):
    """Bad input. The CLI prints ``str(err)`` on one line and exits with status 2."""
