"""Who may write a cache dir. Entries are shared libraries that get dlopen'ed, so a cache
that another user can write is a code-execution hole; refuse it unless the user opts in."""
from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import CacheSecurityError

ALLOW_SHARED_ENV = "DSV4_JIT_ALLOW_SHARED_CACHE"


def shared_opt_in(allow_shared: bool | None) -> bool:
    if allow_shared is not None:
        return bool(allow_shared)
    return os.environ.get(ALLOW_SHARED_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _owner_name(uid: int) -> str:
    try:
        import pwd
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def check_dir(path: Path, *, writable_layer: bool, allow_shared: bool) -> None:
    """Raise CacheSecurityError if `path` is writable by anyone but the caller (or root, for
    read-only layers). Missing paths are fine: the caller creates them 0700."""
    if allow_shared:
        return
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):   # nothing there yet (or cannot be): creating it fails later
        return
    me = os.geteuid()
    owners_ok = (me,) if writable_layer else (me, 0)
    mode = stat.S_IMODE(st.st_mode)
    problems = []
    if st.st_uid not in owners_ok:
        problems.append(f"it is owned by {_owner_name(st.st_uid)}, not by you ({_owner_name(me)})"
                        + ("" if writable_layer else " or root"))
    if mode & stat.S_IWGRP:
        problems.append("it is group-writable")
    if mode & stat.S_IWOTH:
        problems.append("it is world-writable")
    if problems:
        kind = "cache dir" if writable_layer else "read-only cache layer"
        raise CacheSecurityError(
            f"refusing {kind} {path} (owner {_owner_name(st.st_uid)}, mode {mode:04o}): "
            f"{'; '.join(problems)}. Cache entries are shared libraries that get loaded, so others "
            f"could run code in this process. Fix it with `chmod go-w {path}` (and own it), point "
            f"DSV4_JIT_CACHE_DIR at a private dir, or opt in to a shared cache with "
            f"{ALLOW_SHARED_ENV}=1 (allow_shared=True).")
