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
