"""Shared fixtures."""
import pytest


@pytest.fixture()
def isolated_cache(monkeypatch, tmp_path):
    """Each cache test starts as a fresh process would: no cache env vars, a private XDG cache home,
    and the store module's process-wide memos emptied."""
    from dsv4_jit.cache_tools import store as store_mod
    for var in ("DSV4_JIT_CACHE_DIR", "DSV4_JIT_CACHE_LAYERS", "DSV4_JIT_ALLOW_SHARED_CACHE",
                store_mod.PAUSE_BEFORE_MANIFEST_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(store_mod, "_warned", set())
    monkeypatch.setattr(store_mod, "_verified", set())
    monkeypatch.setattr(store_mod, "_bad", {})


# ---- compile tiers ---------------------------------------------------------------------------------
# CI (2 cores, no GPU) cross-compiles one representative variant per kernel and arch, and runs the cheap
# pre-nvcc shared-memory check on every variant; `full` compiles every variant `select` can return for
# every shipped model (run it on demand and before each GPU pass: README "Tests").
COMPILE_TIERS = ("ci", "full", "none")


def pytest_addoption(parser):
    parser.addoption("--compile-tier", choices=COMPILE_TIERS, default=None,
                     help="cross-compile tier: ci (one representative variant per kernel and arch; default), "
                          "full (every variant), none (skip cross-compiles). Env: DSV4_JIT_COMPILE_TIER")


def compile_tier(config) -> str:
    import os
    tier = config.getoption("--compile-tier") or os.environ.get("DSV4_JIT_COMPILE_TIER") or "ci"
    if tier not in COMPILE_TIERS:
        raise pytest.UsageError(f"DSV4_JIT_COMPILE_TIER={tier!r}: expected one of {', '.join(COMPILE_TIERS)}")
    return tier


# ---- GPU tests in parallel (pytest-xdist on the GPU machine) ------------------------------------------
# Workers take turns on the GPU (one test's tensors at a time, the caching allocator emptied after each)
# but let go of the turn around every compile-or-fetch of a variant, so a cold pass compiles on every core
# at once instead of running out of GPU memory with every worker's tensors resident. The turn is released
# around the store's whole get-or-build, not only nvcc: a worker waiting on another's per-key build lock
# must not hold the turn that the builder needs back (that deadlocked the first version).
@pytest.fixture(autouse=True)
def _gpu_turn(request, monkeypatch, tmp_path_factory):
    import os
    if (request.node.get_closest_marker("gpu") is None or not os.environ.get("PYTEST_XDIST_WORKER")
            or os.environ.get("DSV4_JIT_GPU_TURN", "1") == "0"):   # 0: no turns (small cases, few workers)
        yield
        return
    import gc
    from filelock import FileLock
    from dsv4_jit import jit
    lock = FileLock(str(tmp_path_factory.getbasetemp().parent / "gpu_turn.lock"))
    compile_variant = jit.compile_variant

    def compile_variant_without_the_turn(*args, **kwargs):
        lock.release()
        try:
            return compile_variant(*args, **kwargs)
        finally:
            lock.acquire()
    monkeypatch.setattr(jit, "compile_variant", compile_variant_without_the_turn)
    lock.acquire()
    try:
        yield
    finally:
        try:
            import torch
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        finally:
            lock.release()
