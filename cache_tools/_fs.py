"""Small filesystem helpers: durable writes, hashing, name checks, staging-dir naming."""
from __future__ import annotations

import errno
import hashlib
import os
import re
import socket
import uuid
from pathlib import Path

CHUNK = 1 << 20
# errnos that mean "this layer cannot take writes"; we degrade instead of failing the caller.
UNWRITABLE_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT})
_SUFFIX = re.compile(r"^\.[A-Za-z0-9_]{1,16}$")
_PART_BAD = re.compile(r"[\x00-\x1f\\]")


def fsync_dir(path: Path | str) -> None:
    """Make a rename/creation in `path` durable; some filesystems refuse fsync on dirs, ignore that."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_file_durable(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Create `path` (must not exist) with `data`, fsynced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)


def hash_and_fsync(path: Path) -> tuple[str, int]:
    """sha256 and size of a file we are about to publish; fsync it while it is open."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
            size += len(chunk)
        try:
            os.fsync(f.fileno())
        except OSError:
            pass
    return h.hexdigest(), size


def sha256_file(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


_suffix_memo: dict[str, str] = {}


def blob_suffix(name: str) -> str:
    """Keep the file's suffix on its blob (tvm_ffi.load_module wants a `.so` path)."""
    suffix = _suffix_memo.get(name)
    if suffix is None:
        suffix = os.path.splitext(name)[1]
        suffix = suffix if _SUFFIX.match(suffix) else ""
        if len(_suffix_memo) < 4096:  # artifact names repeat across entries ("kernel.so")
            _suffix_memo[name] = suffix
    return suffix


def read_small(path: str) -> bytes:
    """Whole file via raw os calls: cheaper than open() for the warm lookup's manifest read."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while True:
            b = os.read(fd, 1 << 16)
            if not b:
                break
            chunks.append(b)
            if len(b) < (1 << 16):
                break
        return b"".join(chunks)
    finally:
        os.close(fd)


def blob_relpath(sha: str, name: str) -> str:
    return f"{sha[:2]}/{sha}{blob_suffix(name)}"


def check_member_name(name: object) -> str | None:
    """Why `name` is not a safe relative file name inside an entry, or None if it is."""
    if not isinstance(name, str) or not name:
        return "empty or non-string name"
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        return "absolute path"
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "'..', '.' or empty path component"
    if any(_PART_BAD.search(p) or len(p) > 255 for p in parts):
        return "control character, backslash or over-long component"
    return None


def host_tag() -> str:
    """Identifies this host *and* PID namespace, so a pid is only judged dead where it means something."""
    try:
        ns = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        ns = ""
    return hashlib.sha256(f"{socket.gethostname()}|{ns}".encode()).hexdigest()[:8]


def staging_name() -> str:
    return f"{host_tag()}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return True
    return True
