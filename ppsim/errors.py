"""The exception types users see: bad input (a message naming the field and how to fix it), and SIGTERM."""


class PPSimError(ValueError):
    """Bad input. The CLI prints ``str(err)`` on one line and exits with status 2."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (``timeout``, Slurm, Kubernetes), raised where the program is (``ppsim.cli.main``), so that
    it cleans up as on Ctrl-C (no temporary result directory left; the engine writes its partial
    results); exit status 143."""
