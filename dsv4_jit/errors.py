"""Exceptions raised by dsv4-jit. Every user-facing failure is one of these, with a message."""


class Dsv4JitError(Exception):
    """Base class: the CLI prints its message on one line and exits non-zero."""


class UnsupportedArchError(Dsv4JitError, ValueError):
    pass


class SharedMemoryBudgetError(Dsv4JitError, ValueError):
    """A variant's shared-memory need exceeds the target's per-block limit (checked before nvcc)."""


class SealedCompileError(Dsv4JitError, RuntimeError):
    """A kernel compile was requested after `seal("error")`."""


class ConfigError(Dsv4JitError, ValueError):
    """Bad or contradictory model / engine configuration."""
