"""Arch profiles, arch resolution and model configs."""
from __future__ import annotations

import json

import pytest

from dsv4_jit.arch import PROFILES, get_profile, parse_arch_list, resolve_archs, arch_from_capability
from dsv4_jit.errors import ConfigError, UnsupportedArchError
from dsv4_jit.model_config import load_model_config, ParallelConfig


def test_profiles_match_hardware_facts():
    assert get_profile("sm_90a").max_smem_per_block == 232_448
    assert get_profile("sm_100a").max_smem_per_block == 232_448
    for name in ("sm_120a", "sm_121a"):
        p = get_profile(name)
        assert p.max_smem_per_block == 101_376 and not p.has_wgmma and p.mma_path == "mma.sync"
        assert p.pass_configs == {"tl.disable_warp_specialized": True, "tl.disable_tma_lower": True,
                                  "tl.disable_wgmma": True}
    assert [n for n, p in PROFILES.items() if p.has_wgmma] == ["sm_90a"]


def test_aliases_lists_and_errors():
    assert get_profile("SM120").name == "sm_120a" and get_profile("hopper").name == "sm_90a"
    assert [p.name for p in parse_arch_list("sm_120a, sm_90a sm_120")] == ["sm_120a", "sm_90a"]
    with pytest.raises(UnsupportedArchError, match="sm_90a, sm_100a, sm_120a, sm_121a"):
        get_profile("sm_80")
    with pytest.raises(UnsupportedArchError):
        arch_from_capability(8, 0)
    assert arch_from_capability(12, 1).name == "sm_121a"


def test_resolve_archs_order(monkeypatch):
    monkeypatch.delenv("DSV4_JIT_ARCH", raising=False)
    profiles, why = resolve_archs(None)  # no GPU in CI
    assert [p.name for p in profiles] == ["sm_120a"] and "sm_120a" in why
    monkeypatch.setenv("DSV4_JIT_ARCH", "sm_90a")
    assert [p.name for p in resolve_archs(None)[0]] == ["sm_90a"]
    assert [p.name for p in resolve_archs("sm_121a")[0]] == ["sm_121a"]


def test_emulated_profile_keeps_schedule_budget():
    emu = get_profile("sm_120a").emulated(get_profile("sm_90a"))
    assert emu.name == "sm_90a" and emu.schedule == "sm_120a"
    assert emu.max_smem_per_block == 101_376 and not emu.has_wgmma
    assert emu.pass_configs["tl.disable_wgmma"] is True


def test_embedded_models():
    flash = load_model_config("deepseek-v4-flash")
    assert (flash.hidden_size, flash.hc_mult, flash.mix_width, flash.hc_hidden) == (4096, 4, 24, 16384)
    assert flash.hc_sinkhorn_iters == 20 and flash.hc_eps == 1e-6
    pro = load_model_config("DeepSeek-V4-Pro")
    assert pro.hc_hidden == 28_672


def test_hf_config_path_and_errors(tmp_path):
    cfg = json.loads((__import__("dsv4_jit").model_config._EMBEDDED_DIR / "deepseek-v4-flash.json").read_text())
    d = tmp_path / "my-model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    assert load_model_config(d).hidden_size == 4096
    assert load_model_config(d / "config.json").name == "my-model"
    with pytest.raises(ConfigError, match="unknown model"):
        load_model_config(tmp_path / "nope.json")
    del cfg["hc_mult"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="hc_mult"):
        load_model_config(d)
    (d / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_model_config(d)
    with pytest.raises(ConfigError):
        ParallelConfig(tp_size=0)
