"""Compile a kernel variant into the artifact store, and load it back without TileLang's front end.

Key ("direct mode", as ccache): computed from the kernel's *source* fingerprint, the variant's
parameters, the target and the toolchain, so a warm process finds the artifact with no
elaboration, lowering or TIR hashing. The loaded object is the tvm_ffi `executable.so` TileLang
produced; it is plain C against the TVM-FFI ABI, and we call its `main` with every tensor
(inputs then outputs) exactly as the prim_func declares them: no out_idx, no allocation.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from .arch import ArchProfile, get_profile
from .spec import KernelSpec, Variant
from .toolchain import toolchain_fingerprint

log = logging.getLogger("dsv4_jit")

KEY_SCHEMA = 1
BACKEND = "tvm_ffi"
LIB_NAME = "kernel.so"
SOURCE_NAME = "device_kernel.cu"
META_NAME = "meta.json"
# Instructions SM12x cannot execute, or that we refuse to rely on there (see arch.py).
SM12X_FORBIDDEN = ("wgmma", "setmaxnreg", "warpgroup_reg_alloc", "warpgroup_reg_dealloc", "tcgen05")


# ---------------------------------------------------------------------------------------------
# Counters and the seal
# ---------------------------------------------------------------------------------------------
@dataclass
class Counters:
    hits: int = 0          # served from this process's memory
    loads: int = 0         # loaded from the on-disk store (no compile)
    compiles: int = 0      # TileLang + nvcc runs in this process
    sealed_compiles: int = 0
    triton_compiles: int = 0
    load_seconds: float = 0.0
    compile_seconds: float = 0.0
    events: list = field(default_factory=list)

    def as_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "events"}
        d["events"] = list(self.events[-50:])
        return d


COUNTERS = Counters()
_SEAL: dict[str, Any] = {"mode": None}
_LOCK = threading.RLock()


def seal(mode: str = "warn") -> None:
    """After warmup: any later compile is logged with kernel, variant and caller shape ("warn")
    or raises SealedCompileError ("error"). Also watches Triton JIT compiles in this process."""
    if mode not in ("warn", "error", "off"):
        raise ValueError(f"seal mode must be 'warn', 'error' or 'off', got {mode!r}")
    _SEAL["mode"] = None if mode == "off" else mode
    if mode != "off":
        _install_triton_hook()


def sealed() -> str | None:
    return _SEAL["mode"]


def counters() -> dict:
    return COUNTERS.as_dict()


def reset_counters() -> None:
    global COUNTERS
    COUNTERS.__init__()


def _on_late_compile(what: str, detail: str) -> None:
    from .errors import SealedCompileError
    msg = f"dsv4-jit: compile after seal: {what} ({detail}); warmup did not cover this shape"
    COUNTERS.sealed_compiles += 1
    COUNTERS.events.append(msg)
    if _SEAL["mode"] == "error":
        raise SealedCompileError(msg)
    log.warning(msg)


_TRITON_HOOK_INSTALLED = False


def _install_triton_hook() -> None:
    """Triton's jit_post_compile_hook sees every Triton JIT compile (DSv4 engines on SM12x run
    Triton kernels that stall the same way). Chains any hook already set."""
    global _TRITON_HOOK_INSTALLED
    if _TRITON_HOOK_INSTALLED:
        return
    try:
        from triton import knobs  # type: ignore
    except Exception:
        return
    prev = knobs.runtime.jit_post_compile_hook

    def hook(*args, **kwargs):
        COUNTERS.triton_compiles += 1
        if _SEAL["mode"] is not None:
            name = kwargs.get("fn") or (args[0] if args else "?")
            name = getattr(getattr(name, "fn", name), "__name__", str(name))
            _on_late_compile("triton kernel", str(name))
        if prev is not None:
            return prev(*args, **kwargs)
        return None

    knobs.runtime.jit_post_compile_hook = hook
    _TRITON_HOOK_INSTALLED = True


# ---------------------------------------------------------------------------------------------
# Keys and the store
# ---------------------------------------------------------------------------------------------
_STORE = None


def default_store():
    global _STORE
    if _STORE is None:
        from .cache_tools.store import Store
        _STORE = Store()
    return _STORE


def prepare() -> float:
    """Once per process, at engine start: open the store, fingerprint the toolchain, register
    TileLang's module loader. Returns seconds taken. Later loads then cost only a manifest read
    and a dlopen each."""
    t0 = time.perf_counter()
    default_store()
    toolchain_fingerprint()
    _ensure_runtime()
    return time.perf_counter() - t0


def set_default_store(store) -> None:
    global _STORE
    _STORE = store


def key_fields(spec: KernelSpec, variant: Variant) -> dict:
    return {
        "schema": KEY_SCHEMA,
        **variant.key_fields(),
        "code": spec.code_fingerprint,
        "pass_configs": {k: v for k, v in sorted(spec.pass_configs(variant).items())},
        "backend": BACKEND,
        "toolchain": toolchain_fingerprint(),
    }


_KEY_MEMO: dict[tuple[str, Variant], str] = {}


def artifact_key(spec: KernelSpec, variant: Variant) -> str:
    memo = (spec.name, variant)
    key = _KEY_MEMO.get(memo)
    if key is None:
        from .cache_tools.keys import compute_key
        key = _KEY_MEMO[memo] = compute_key(key_fields(spec, variant))
    return key


def lookup(spec: KernelSpec, variant: Variant, store=None):
    return (store or default_store()).lookup(artifact_key(spec, variant))


# ---------------------------------------------------------------------------------------------
# Compile
# ---------------------------------------------------------------------------------------------
def _shared_memory_bytes(kernel) -> int:
    """Shared memory the lowered kernel really allocates (all `shared*` buffers of the device module)."""
    from tilelang import tvm
    art = getattr(kernel, "artifact", None)
    if art is None or getattr(art, "device_mod", None) is None:
        return -1
    total = 0

    def visit(node):
        nonlocal total
        if type(node).__name__ == "AllocBuffer":
            buf = node.buffer
            if str(buf.scope()).startswith("shared"):
                n = 1
                for s in buf.shape:
                    n *= int(s)
                total += n * tvm.DataType(buf.dtype).bits // 8

    for _, fn in art.device_mod.functions.items():
        if hasattr(fn, "body"):
            tvm.tirx.stmt_functor.post_order_visit(fn.body, visit)
    return total


def _param_signature(prim_func) -> list[dict]:
    sig = []
    for p in prim_func.params:
        buf = prim_func.buffer_map.get(p)
        if buf is None:
            sig.append({"name": str(p.name), "scalar": str(p.dtype)})
        else:
            sig.append({"name": str(buf.name), "dtype": str(buf.dtype),
                        "shape": [int(s) if hasattr(s, "value") else str(s) for s in buf.shape]})
    return sig


def compile_to_dir(spec: KernelSpec, variant: Variant, out_dir: Path) -> dict:
    """Run TileLang + nvcc for one variant; write kernel.so, device source and meta into out_dir."""
    profile = variant.profile   # the target ISA, with the schedule's budget and family
    need = spec.check_fits(variant)  # before nvcc: a clear error, never a launch failure
    os.environ.setdefault("TILELANG_DISABLE_CACHE", "1")  # we are the cache; no second copy
    import tilelang
    from tilelang.env import env as tl_env
    tl_env.disable_cache()

    t0 = time.perf_counter()
    prim = spec.build(variant)
    kernel = tilelang.compile(prim, target=profile.target, execution_backend=BACKEND,
                              pass_configs=spec.pass_configs(variant))
    seconds = time.perf_counter() - t0
    src = kernel.get_kernel_source()
    if profile.family == "blackwell_consumer":
        bad = [w for w in SM12X_FORBIDDEN if w in src]
        if bad:
            raise RuntimeError(f"{variant.name}: SM12x schedule emitted {', '.join(bad)}")
    smem = _shared_memory_bytes(kernel)
    if smem > profile.max_smem_per_block:
        from .errors import SharedMemoryBudgetError
        raise SharedMemoryBudgetError(
            f"{variant.name}: lowered kernel uses {smem:,} B shared memory > {profile.max_smem_per_block:,} B "
            f"({variant.schedule}); estimate was {need:,} B")
    out_dir.mkdir(parents=True, exist_ok=True)
    kernel.export_library(str(out_dir / LIB_NAME))
    (out_dir / SOURCE_NAME).write_text(src)
    meta = {
        "variant": variant.name,
        "signature": _param_signature(kernel.prim_func),
        "smem_bytes": smem,
        "smem_estimate": need,
        "compile_seconds": round(seconds, 3),
        "uses_wgmma": "wgmma" in src,
    }
    (out_dir / META_NAME).write_text(json.dumps(meta, indent=1))
    return meta


def compile_variant(spec: KernelSpec, variant: Variant, store=None, *, caller: str = ""):
    """Compile into the store (once across processes: the store's per-key lock) or return the entry."""
    store = store or default_store()
    key = artifact_key(spec, variant)

    def build(staging: Path) -> dict:
        if _SEAL["mode"] is not None:
            _on_late_compile("tilelang kernel", f"{variant.name}{', ' + caller if caller else ''}")
        t0 = time.perf_counter()
        meta = compile_to_dir(spec, variant, staging)
        with _LOCK:
            COUNTERS.compiles += 1
            COUNTERS.compile_seconds += time.perf_counter() - t0
        return meta

    # get_or_build looks the key up first (one counted lookup) and builds only on a miss.
    return store.get_or_build(key, key_fields(spec, variant), build)


# ---------------------------------------------------------------------------------------------
# Load (the warm path)
# ---------------------------------------------------------------------------------------------
class LoadedKernel:
    """A compiled variant, callable as kernel(*tensors) in the prim_func's parameter order."""

    __slots__ = ("variant", "meta", "_fn", "_mod", "path")

    def __init__(self, variant: Variant, meta: Mapping[str, Any], mod, path: str):
        self.variant = variant
        self.meta = dict(meta)
        self._mod = mod
        self._fn = mod["main"]
        self.path = path

    def __call__(self, *args):
        return self._fn(*args)

    def __repr__(self) -> str:
        return f"LoadedKernel({self.variant.name})"


_RUNTIME_READY = False


def _ensure_runtime() -> None:
    """`import tilelang` registers the CUDA module loader that executable.so needs (process-wide,
    once); loading or calling a kernel never elaborates or lowers anything."""
    global _RUNTIME_READY
    if not _RUNTIME_READY:
        import tilelang  # noqa: F401
        _RUNTIME_READY = True


def load_entry(variant: Variant, entry) -> LoadedKernel:
    _ensure_runtime()
    import tvm_ffi
    t0 = time.perf_counter()
    path = str(entry.files[LIB_NAME])
    mod = tvm_ffi.load_module(path)
    meta = entry.extra or {}
    k = LoadedKernel(variant, meta, mod, path)
    with _LOCK:
        COUNTERS.loads += 1
        COUNTERS.load_seconds += time.perf_counter() - t0
    return k


_LOADED: dict[tuple[str, Variant], LoadedKernel] = {}


def load(spec: KernelSpec, variant: Variant, store=None, *, compile_missing: bool = True,
         caller: str = "") -> LoadedKernel:
    """Memory, then the store, then (unless told not to) compile."""
    memo = (spec.name, variant)
    k = _LOADED.get(memo)
    if k is not None:
        COUNTERS.hits += 1
        return k
    with _LOCK:
        k = _LOADED.get(memo)
        if k is not None:
            COUNTERS.hits += 1
            return k
        store = store or default_store()
        if compile_missing:
            entry = compile_variant(spec, variant, store, caller=caller)
        else:
            entry = store.lookup(artifact_key(spec, variant))
            if entry is None:
                raise LookupError(f"{variant.name} is not in the cache")
        k = _LOADED[memo] = load_entry(variant, entry)
        return k


# ---------------------------------------------------------------------------------------------
# The one runtime path: select + load. The planner enumerates the same `select`.
# ---------------------------------------------------------------------------------------------
_SELECT_MEMO: dict[tuple, LoadedKernel] = {}


def _freeze_static(static: Mapping[str, Any]) -> tuple:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in static.items()))


def get_kernel(spec: KernelSpec, static: Mapping[str, Any], num_tokens: int,
               arch: ArchProfile | str | None = None) -> LoadedKernel:
    """What serving calls on every launch: `spec.select(...)` then load. Memoised per
    (kernel, static, num_tokens, arch), so a hot call is one dict lookup."""
    memo = (spec.name, _freeze_static(static), num_tokens, arch if isinstance(arch, (str, type(None))) else (arch.name, arch.schedule))
    k = _SELECT_MEMO.get(memo)
    if k is not None:
        COUNTERS.hits += 1
        return k
    profile = current_arch() if arch is None else get_profile(arch)
    variant = spec.select(profile, static, num_tokens)
    k = load(spec, variant, caller=f"num_tokens={num_tokens}")
    _SELECT_MEMO[memo] = k
    return k


_CURRENT_ARCH: list[ArchProfile] = []


def current_arch() -> ArchProfile:
    """The profile this process serves with: DSV4_JIT_ARCH, else the GPU. Resolved once."""
    if not _CURRENT_ARCH:
        from .arch import detect_arch
        from .errors import UnsupportedArchError
        env = os.environ.get("DSV4_JIT_ARCH")
        prof = get_profile(env.split(",")[0]) if env else detect_arch()
        if prof is None:
            raise UnsupportedArchError("no CUDA GPU visible and DSV4_JIT_ARCH is not set")
        _CURRENT_ARCH.append(prof)
    return _CURRENT_ARCH[0]


_GETTERS: dict[Any, Callable] = {}


def kernel_getter(arch: ArchProfile | str | None = None) -> Callable:
    """A `get_kernel(spec, static, num_tokens)` bound to one arch, as the op wrappers take it. One
    object per arch: the op wrappers key their per-signature launch plans on it."""
    g = _GETTERS.get(arch)
    if g is None:
        def g(spec: KernelSpec, static: Mapping[str, Any], num_tokens: int) -> LoadedKernel:
            return get_kernel(spec, static, num_tokens, arch)
        _GETTERS[arch] = g
    return g
