"""Cache exceptions. All derive from Dsv4JitError so the CLI prints one line and exits 1."""
from __future__ import annotations

from dsv4_jit.errors import Dsv4JitError


class CacheError(Dsv4JitError, RuntimeError):
    """A cache operation failed in a way the caller must see."""


class CacheSecurityError(CacheError, PermissionError):
    """A cache dir is writable by someone other than the caller (entries hold loadable code)."""


class KeyFieldError(CacheError, ValueError):
    """Key fields are not pure content (a path, HOME, host or user name) or not JSON-serialisable."""


class BundleError(CacheError, ValueError):
    """An export/import bundle is malformed, unsafe or for another toolchain; nothing was installed."""


class CacheWarning(UserWarning):
    """Cache degraded (memory-only, unlocked, quarantine); serving continues."""
