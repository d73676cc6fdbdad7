"""Compile/load core: keys, the shared-memory check before nvcc, warm load with zero compiles, seal."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dsv4_jit import jit
from dsv4_jit.arch import get_profile
from dsv4_jit.errors import SealedCompileError, SharedMemoryBudgetError
from dsv4_jit.model_config import load_model_config, ParallelConfig

sys.path.insert(0, str(Path(__file__).parent))
from jit_toy_kernel import ToySpec  # noqa: E402

FLASH = load_model_config("deepseek-v4-flash")


@pytest.fixture()
def store(tmp_path, monkeypatch):
    from dsv4_jit.cache_tools.store import Store
    monkeypatch.setenv("DSV4_JIT_CACHE_DIR", str(tmp_path / "cache"))
    s = Store()
    jit.set_default_store(s)
    jit.reset_counters()
    jit._LOADED.clear()
    jit._SELECT_MEMO.clear()
    yield s
    jit.set_default_store(None)
    jit.seal("off")


def _variant(spec, arch="sm_120a", tokens=8):
    return spec.select(get_profile(arch), spec.static_params(FLASH, ParallelConfig()), tokens)


def test_key_is_content_only(tmp_path, monkeypatch):
    spec = ToySpec()
    v = _variant(spec)
    k1 = jit.artifact_key(spec, v)
    fields = jit.key_fields(spec, v)
    text = json.dumps(fields)
    assert os.path.expanduser("~") not in text and str(Path.cwd()) not in text
    for name in ("tilelang", "tilelang_libs", "nvcc", "host_abi"):
        assert name in fields["toolchain"]
    assert fields["arch"] == "sm_120a" and fields["code"] == spec.code_fingerprint
    # Another variant, another arch, another schedule: other keys. Same inputs: same key.
    assert jit.artifact_key(spec, _variant(spec, tokens=100)) != k1
    assert jit.artifact_key(spec, _variant(spec, arch="sm_90a")) != k1
    emu = get_profile("sm_120a").emulated(get_profile("sm_90a"))
    v_emu = spec.select(emu, {"hidden": 4096}, 8)
    assert v_emu.arch == "sm_90a" and v_emu.schedule == "sm_120a"
    assert jit.artifact_key(spec, v_emu) not in (k1, jit.artifact_key(spec, _variant(spec, arch="sm_90a")))
    jit._KEY_MEMO.clear()
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert jit.artifact_key(spec, v) == k1


def test_smem_budget_checked_before_nvcc(store, monkeypatch):
    spec = ToySpec(smem_elems=80_000)  # 160,000 B: fits Hopper's 232,448, not SM120's 101,376
    v = _variant(spec, "sm_120a")
    import tilelang
    monkeypatch.setattr(tilelang, "compile", lambda *a, **k: pytest.fail("nvcc must not run"))
    with pytest.raises(SharedMemoryBudgetError) as e:
        jit.compile_variant(spec, v, store)
    msg = str(e.value)
    assert "toy_scale2" in msg and "160,000" in msg and "101,376" in msg and "sm_120a" in msg
    assert store.lookup(jit.artifact_key(spec, v)) is None


@pytest.mark.compile
def test_compile_records_real_smem_and_warm_load_has_zero_compiles(store, tmp_path):
    spec = ToySpec(smem_elems=2048)
    v = _variant(spec, "sm_120a")
    entry = jit.compile_variant(spec, v, store)
    assert jit.counters()["compiles"] == 1
    meta = entry.extra
    assert meta["smem_bytes"] == 4096 and meta["smem_estimate"] == 4096
    assert meta["signature"][0]["shape"] == ["num_tokens", 4096]
    src = Path(entry.files[jit.SOURCE_NAME]).read_text()
    assert "wgmma" not in src and "setmaxnreg" not in src
    # Same key again: served from the store, no second compile.
    assert jit.compile_variant(spec, v, store).key == entry.key
    assert jit.counters()["compiles"] == 1

    # A fresh process loads it with TileLang's front end booby-trapped: zero compiles, no lowering.
    child = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import tilelang
        from tilelang.jit.kernel import JITKernel
        def trap(*a, **k): raise SystemExit("TileLang front end was used")
        tilelang.compile = trap; tilelang.lower = trap; JITKernel.__init__ = trap
        from dsv4_jit import jit
        from dsv4_jit.arch import get_profile
        from jit_toy_kernel import ToySpec
        spec = ToySpec(smem_elems=2048)
        v = spec.select(get_profile("sm_120a"), {{"hidden": 4096}}, 8)
        k = jit.load(spec, v, compile_missing=False)
        assert callable(k._fn)
        print(json.dumps(jit.counters()))
    """)
    env = dict(os.environ, DSV4_JIT_CACHE_DIR=str(store.root))
    out = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    c = json.loads(out.stdout.strip().splitlines()[-1])
    assert c["compiles"] == 0 and c["loads"] == 1


def test_seal_error_and_warn(store, caplog):
    spec = ToySpec(smem_elems=80_000)  # never compiles on sm_120a; the seal must fire first
    v = _variant(spec, "sm_120a", tokens=8)
    jit.seal("error")
    with pytest.raises(SealedCompileError) as e:
        jit.load(spec, v, store, caller="num_tokens=8")
    assert "toy_scale2" in str(e.value) and "num_tokens=8" in str(e.value)
    jit.seal("warn")
    with caplog.at_level(logging.WARNING, logger="dsv4_jit"), pytest.raises(SharedMemoryBudgetError):
        jit.load(spec, v, store, caller="num_tokens=8")
    assert any("compile after seal" in r.message for r in caplog.records)
    assert jit.counters()["sealed_compiles"] == 2
    with pytest.raises(ValueError):
        jit.seal("maybe")


def test_select_rejects_bad_token_counts():
    spec = ToySpec()
    for bad in (0, -3, 2.5, "8"):
        with pytest.raises(ValueError):
            spec.select(get_profile("sm_120a"), {"hidden": 4096}, bad)


def test_code_fingerprint_covers_imported_kernel_modules():
    from dsv4_jit.spec import get_spec
    head = get_spec("mhc_head")
    mods = [m.__name__ for m in head.source_closure()]
    # mhc_head builds on helpers from mhc post (which uses mhc pre): editing those must change its key;
    # the host ops, references and family registration are not kernel source and stay out of it.
    assert mods == ["dsv4_jit.kernels.mhc.head", "dsv4_jit.kernels.mhc.post", "dsv4_jit.kernels.mhc.pre"]
    assert len(head.code_fingerprint) == 64 and head.code_fingerprint != get_spec("mhc_post").code_fingerprint


_KERNEL_SRC = '''"""A toy kernel module."""
import math

# tile chosen for the L2 size
TILE = 64


def build(n):
    """Return the block count."""
    return math.ceil(n / TILE)  # round up
'''


def _spec_over(tmp_path, name: str, source: str):
    """A KernelSpec whose source module is `source`, imported fresh from a file."""
    import importlib.util
    from dsv4_jit.spec import KernelSpec
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    mod_spec = importlib.util.spec_from_file_location(f"toykernels.{name}", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    sys.modules[mod.__name__] = mod

    class Spec(KernelSpec):
        source_modules = (mod,)
    Spec.name = "toy"
    return Spec()


def test_code_fingerprint_ignores_comments_and_docstrings(tmp_path):
    base = _spec_over(tmp_path, "k0", _KERNEL_SRC).code_fingerprint
    # module, function docstrings and comments edited, a blank line added, formatting changed: same key
    edited = (_KERNEL_SRC.replace("A toy kernel module.", "Toy kernel; measured 3.1 us on H100.")
              .replace("# tile chosen for the L2 size", "# 64: best of the sweep\n")
              .replace('"""Return the block count."""', '"""Blocks.\n\n    More words."""')
              .replace("# round up", "# ceil").replace("TILE = 64", "TILE  =  64"))
    assert _spec_over(tmp_path, "k0", edited).code_fingerprint == base
    # a module whose docstring is removed entirely keeps it too
    assert _spec_over(tmp_path, "k0", _KERNEL_SRC.split("\n", 1)[1]).code_fingerprint == base
    # code edits change it: a constant, an operator, a new statement, a string that is not a docstring
    for code_edit in (_KERNEL_SRC.replace("TILE = 64", "TILE = 128"),
                      _KERNEL_SRC.replace("n / TILE", "n // TILE"),
                      _KERNEL_SRC + "\nEXTRA = 1\n",
                      _KERNEL_SRC.replace("    return", "    x = 'why'\n    return")):
        assert _spec_over(tmp_path, "k0", code_edit).code_fingerprint != base, code_edit
    # the module name is part of it: the same code in another module is another kernel
    assert _spec_over(tmp_path, "k1", _KERNEL_SRC).code_fingerprint != base


# ------------------------------------------------------------------------------- the variant's profile
def test_variant_carries_its_profile_outside_its_identity():
    """select hands the variant the profile it was given (retargeted where the schedule is emulated); equality,
    hash, name and the artifact key's fields see the four named fields only."""
    import dataclasses
    import pickle
    from dsv4_jit.spec import Variant
    spec = ToySpec()
    sm120, hopper = get_profile("sm_120a"), get_profile("sm_90a")
    v = _variant(spec, "sm_120a")
    assert v.profile is sm120
    assert [f.name for f in dataclasses.fields(Variant) if f.compare] == ["kernel", "params", "arch", "schedule"]
    assert v.key_fields() == {"kernel": v.kernel, "params": [[k, val] for k, val in v.params], "arch": "sm_120a",
                              "schedule": "sm_120a"}
    by_name = Variant(v.kernel, v.params, v.arch, v.schedule)   # from names: the profile is resolved once
    assert by_name.profile == sm120 and by_name == v and hash(by_name) == hash(v) and repr(by_name) == repr(v)
    emu = sm120.emulated(hopper)
    v_emu = spec.select(emu, {"hidden": 4096}, 8)
    assert v_emu.profile is emu and (v_emu.profile.name, v_emu.profile.family) == ("sm_90a", "blackwell_consumer")
    # the emulated schedule rebuilt from names, or from the target profile plus the schedule's name, is the same
    # profile in every field the compile reads
    for rebuilt in (Variant(v_emu.kernel, v_emu.params, "sm_90a", "sm_120a"),
                    Variant.make(v_emu.kernel, v_emu.p, hopper, schedule="sm_120a")):
        assert rebuilt == v_emu and rebuilt.profile == emu
        assert spec.pass_configs(rebuilt) == spec.pass_configs(v_emu) == dict(sm120.pass_configs)
    assert pickle.loads(pickle.dumps(v_emu)).profile == emu
    assert jit.key_fields(spec, by_name) == jit.key_fields(spec, v)
    assert jit.key_fields(spec, v)["pass_configs"] == dict(sorted(get_profile(v.schedule).pass_configs.items()))


def test_get_kernel_selects_once_per_signature(monkeypatch):
    """The serving path: the first call of a (kernel, static, tokens, arch) selects and loads; later calls are a
    memo hit with no select at all."""
    spec = ToySpec()
    calls = []
    real = spec.select
    monkeypatch.setattr(spec, "select", lambda *a: calls.append(a) or real(*a))
    monkeypatch.setattr(jit, "load", lambda s, v, *a, **k: ("loaded", v))
    monkeypatch.setattr(jit, "_SELECT_MEMO", {})
    got = [jit.get_kernel(spec, {"hidden": 4096}, 8, get_profile("sm_120a")) for _ in range(3)]
    assert len(calls) == 1 and got[0] is got[1] is got[2] and got[0][1].profile is get_profile("sm_120a")
