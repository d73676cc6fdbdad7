"""Fingerprint of everything outside our source that changes compiled bytes.

Part of every artifact key and of every exported bundle. Content only: versions and
content hashes, never a path, an mtime, a host or a user."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

_NATIVE_LIBS = ("libtilelang.so", "libtvm_runtime.so", "libtvm_compiler.so")


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _memo_path() -> Path | None:
    """memo/ beside the artifact store, in the cache dir the user chose ($DSV4_JIT_CACHE_DIR)."""
    try:
        from .cache_tools.store import default_cache_dir
        d = default_cache_dir() / "memo"
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        return d / "libhash.json"
    except Exception:
        return None


def _hash_libs(lib_dir: Path) -> str:
    """sha256 over TileLang's native libraries. Hashing ~100 MB costs ~0.2 s, so the result is
    memoised per (name, size, mtime_ns) locally; the memo never enters a key."""
    files = [lib_dir / n for n in _NATIVE_LIBS if (lib_dir / n).exists()]
    stat_id = "|".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)
    memo = _memo_path()
    cached: dict = {}
    if memo is not None and memo.exists():
        try:
            cached = json.loads(memo.read_text())
        except Exception:
            cached = {}
    if stat_id in cached:
        return cached[stat_id]
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode())
        h.update(_sha256_file(p).encode())
    digest = h.hexdigest()
    if memo is not None:
        try:
            tmp = memo.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({stat_id: digest}))
            os.replace(tmp, memo)
        except OSError:
            pass
    return digest


def _tilelang_info() -> dict:
    import importlib.util
    spec = importlib.util.find_spec("tilelang")
    if spec is None or spec.origin is None:
        return {"tilelang": None, "tilelang_libs": None}
    pkg = Path(spec.origin).parent
    version = None
    try:
        from importlib.metadata import version as _v
        version = _v("tilelang")
    except Exception:
        pass
    return {"tilelang": version, "tilelang_libs": _hash_libs(pkg / "lib")}


def find_nvcc() -> str | None:
    """The nvcc TileLang would use: $CUDA_HOME/bin/nvcc, then PATH."""
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").exists():
            return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


@functools.lru_cache(maxsize=None)
def nvcc_version() -> str | None:
    nvcc = find_nvcc()
    if nvcc is None:
        return None
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"V(\d+\.\d+\.\d+)", out)
    return m.group(1) if m else None


def host_abi() -> str:
    """ABI of the host-side library in an artifact.

    TileLang's tvm_ffi backend emits a plain C shared object that links only libc and the
    TVM-FFI C ABI (checked with `nm -D`): it does not depend on the Python version, so the
    tag names the TVM-FFI version and the platform, not CPython. That is what lets a cache
    built with one Python load under another."""
    try:
        from importlib.metadata import version as _v
        ffi = _v("apache-tvm-ffi")
    except Exception:
        ffi = "unknown"
    return f"tvm_ffi-{ffi}-{platform.system().lower()}-{platform.machine()}"


@functools.lru_cache(maxsize=None)
def toolchain_fingerprint() -> dict:
    """{"tilelang", "tilelang_libs", "nvcc", "host_abi"}: stable across paths, hosts and Pythons."""
    info = _tilelang_info()
    info["nvcc"] = nvcc_version()
    info["host_abi"] = host_abi()
    return info


def describe_difference(expected: dict, actual: dict) -> str:
    diffs = [f"{k}: bundle {expected.get(k)!r} vs here {actual.get(k)!r}"
             for k in sorted(set(expected) | set(actual)) if expected.get(k) != actual.get(k)]
    return "; ".join(diffs)
