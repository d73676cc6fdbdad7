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
