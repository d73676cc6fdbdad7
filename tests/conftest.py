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


@pytest.fixture
def cpu_tensors_ok(monkeypatch):
    """check_tensor minus its CUDA-device rule, so every other rule is testable on this GPU-less machine."""
    import torch
    import dsv4_jit.validate as val
    orig = val.check_tensor

    def check(t, name, shape, dtype, device=None, *, contiguous=True):
        if isinstance(t, torch.Tensor) and t.device.type == "cpu":
            t = t.to("meta")
            device = None if device is None else torch.device("meta")
            if not isinstance(t, torch.Tensor):
                raise ValueError(name)
            try:
                return orig(t, name, shape, dtype, device, contiguous=contiguous)
            except ValueError as e:
                if "CUDA" in str(e):
                    return None
                raise
        return orig(t, name, shape, dtype, device, contiguous=contiguous)
    monkeypatch.setattr(val, "check_tensor", check)


# ---- GPU tests ---------------------------------------------------------------------------------------
def gpu_profile_params(placeholder: bool = False) -> list:
    """pytest params of the profiles this machine's GPU proves (dsv4_jit.testing.gpu_profiles), with readable ids;
    without a GPU, none (or one `None` param when `placeholder`, for a test that skips itself)."""
    from dsv4_jit.testing import gpu_profiles, profile_id
    params = [pytest.param(p, id=profile_id(p)) for p in gpu_profiles()]
    return params or ([pytest.param(None, id="no-gpu")] if placeholder else [])


@pytest.fixture(scope="module")
def gpu_store(tmp_path_factory):
    """The store a test module's GPU kernels load through: $DSV4_JIT_CACHE_DIR when set, else a fresh one."""
    from dsv4_jit.testing import store_for_gpu_tests
    return store_for_gpu_tests(tmp_path_factory.mktemp("gpu_store"))


# ---- compile tiers ---------------------------------------------------------------------------------
# CI (2 cores, no GPU) cross-compiles one representative variant per kernel and arch, and runs the cheap
# pre-nvcc shared-memory check on every variant; `full` compiles every variant `select` can return for
# every shipped model (run it on demand and before each GPU pass: docs/testing.md).
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
# Under xdist, workers take turns on the GPU: the launches and the float64 references of one test at a time,
# the caching allocator emptied before the turn passes on. CPU work (inputs, plans) stays outside the turn,
# and a compile-or-fetch of a variant lets go of it, so a cold pass compiles on every core at once instead
# of running out of GPU memory with every worker's tensors resident (what 16 unturned workers did).
# The turn is released around the store's whole get-or-build, not only nvcc: a worker waiting on another's
# per-key build lock must not hold the turn that the builder needs back (a first version deadlocked so).
# DSV4_JIT_GPU_TURN=0: no turns (small cases, few workers).
class GpuTurn:
    # a worker waiting longer than this for the GPU means another one hung: fail, naming the lock
    WAIT_S = 1800

    def __init__(self, path=None):
        from filelock import FileLock
        self._lock = FileLock(str(path)) if path else None
        self.held = False

    def acquire(self) -> None:
        if self._lock is not None and not self.held:
            from filelock import Timeout
            try:
                self._lock.acquire(timeout=self.WAIT_S)
            except Timeout:
                raise RuntimeError(f"waited {self.WAIT_S} s for the GPU turn ({self._lock.lock_file}): "
                                   "another xdist worker holds it (a hung kernel?)") from None
            self.held = True

    # cached GPU memory past this is handed back before the turn passes on, so the next worker's tensors fit
    KEEP_CACHED_BYTES = 8 << 30

    def release(self, collect: bool = False) -> None:
        """Pass the turn on. `collect`: after a failure, whose traceback frames keep tensors alive, collect them
        first (a full gc per turn costs more than the GPU work of a small case)."""
        if self._lock is None or not self.held:
            return
        try:
            import torch
            if collect:
                import gc
                gc.collect()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
                if collect or torch.cuda.memory_reserved() > self.KEEP_CACHED_BYTES:
                    torch.cuda.empty_cache()
        except RuntimeError:
            pass   # a CUDA fault already failed the test: keep its error, still pass the turn on
        finally:
            self.held = False
            self._lock.release()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release(collect=exc[0] is not None)


@pytest.fixture
def gpu_turn(request, monkeypatch, tmp_path_factory):
    """A GpuTurn for this test (inert outside xdist or with DSV4_JIT_GPU_TURN=0); use `with gpu_turn:` around
    the GPU work. Tests marked gpu that do not ask for it hold the turn throughout (see _gpu_turn_whole_test)."""
    import os
    if not os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get("DSV4_JIT_GPU_TURN", "1") == "0":
        yield GpuTurn()
        return
    from dsv4_jit import jit
    turn = GpuTurn(tmp_path_factory.getbasetemp().parent / "gpu_turn.lock")
    compile_variant = jit.compile_variant

    def compile_variant_without_the_turn(*args, **kwargs):
        had = turn.held
        turn.release()
        try:
            return compile_variant(*args, **kwargs)
        finally:
            if had:
                turn.acquire()
    monkeypatch.setattr(jit, "compile_variant", compile_variant_without_the_turn)
    try:
        yield turn
    finally:
        turn.release()


@pytest.fixture(autouse=True)
def _gpu_turn_whole_test(request):
    if request.node.get_closest_marker("gpu") is None or "gpu_turn" in request.fixturenames:
        yield
        return
    turn = request.getfixturevalue("gpu_turn")
    with turn:
        yield
