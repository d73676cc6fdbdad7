#!/usr/bin/env python3
"""The CPU half of the co-install check (scripts/coinstall_check.sh runs it inside the venv with vLLM's pins).

    python3 coinstall_load_check.py compile CACHE_DIR BUNDLE   # mhc_post for sm_120a into CACHE_DIR, exported
    python3 coinstall_load_check.py load CACHE_DIR             # sealed ("error"): load it back, zero compiles

Loading needs no GPU (tvm_ffi.load_module of the artifact); running it does (scripts/gpu_coinstall_check.py).
"""
from __future__ import annotations

import json
import os
import sys
from importlib import metadata


def _variant():
    from dsv4_jit.arch import get_profile
    from dsv4_jit.family import all_families
    from dsv4_jit.model_config import ParallelConfig, load_model_config
    (use,) = [u for u in all_families()["mhc"].uses(load_model_config("deepseek-v4-flash"), ParallelConfig())
              if u.spec.name == "mhc_post"][:1]
    return use.spec, use.spec.select(get_profile("sm_120a"), use.static, 7)


def main(argv: list[str]) -> int:
    mode, cache = argv[0], argv[1]
    os.environ["DSV4_JIT_CACHE_DIR"] = cache
    os.environ["DSV4_JIT_CACHE_LAYERS"] = ""
    from dsv4_jit import jit
    from dsv4_jit.cache_tools.store import Store
    jit.set_default_store(Store())
    spec, variant = _variant()
    tl = jit.toolchain_fingerprint()["tilelang"]
    if tl != metadata.version("tilelang"):
        raise SystemExit(f"FAIL: the key's TileLang {tl} is not the installed {metadata.version('tilelang')}")
    if mode == "compile":
        jit.compile_variant(spec, variant)
        from dsv4_jit.cli import main as cli
        rc = cli(["cache", "export", argv[2], "--cache-dir", cache])
        print(json.dumps({"compiled": variant.name, "tilelang": tl, "counters": _counts(jit)}))
        return rc
    jit.seal("error")   # any compile now raises
    k = jit.load(spec, variant)
    c = _counts(jit)
    print(json.dumps({"loaded": k.path, "tilelang": tl, "counters": c}))
    if c["compiles"] or c["sealed_compiles"] or c["loads"] != 1:
        raise SystemExit(f"FAIL: {c}")
    return 0


def _counts(jit) -> dict:
    c = jit.counters()
    return {k: c[k] for k in ("compiles", "loads", "sealed_compiles")}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
