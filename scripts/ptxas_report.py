"""Registers, spills and stack of one kernel variant, from ptxas, with no GPU:

    python scripts/ptxas_report.py sparse_mla_fwd sm_120a '{"heads": 64, "head_block": 32, "block_i": 32,
        "threads": 256, "kv_format": "fp8_ds_mla", "n_splits": 1, "softmax_scale": 0.0441941738}'

The variant is built by hand (any params, not only what select picks), for the schedule named (sm_120a and other
non-native schedules are compiled for sm_90a, as the GPU pass runs them when --emulate is given). TileLang's compile
callback discards nvcc's output, so this wraps tilelang.contrib.nvcc.compile_cuda to ask ptxas to be verbose and
prints what it says.
"""
from __future__ import annotations

import argparse
import io
import json
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("kernel")
    ap.add_argument("arch", help="schedule: sm_120a, sm_90a, sm_100a")
    ap.add_argument("params", help="the variant's params as JSON")
    ap.add_argument("--emulate", action="store_true", help="compile a non-sm_90a schedule for sm_90a")
    args = ap.parse_args(argv)

    import tilelang
    import tilelang.contrib.nvcc as nvcc

    orig = nvcc.compile_cuda

    def verbose_compile(*a, **k):
        opts = k.get("options") or []
        k["options"] = ([opts] if isinstance(opts, str) else list(opts)) + ["--ptxas-options=--verbose"]
        k["verbose"] = True
        return orig(*a, **k)

    import dsv4_jit.kernels  # noqa: F401  (registers every spec)
    from dsv4_jit.arch import get_profile
    from dsv4_jit.jit import BACKEND
    from dsv4_jit.spec import Variant, get_spec

    prof = get_profile(args.arch)
    if args.emulate:
        prof = prof.emulated(get_profile("sm_90a"))
    spec = get_spec(args.kernel)
    v = Variant.make(spec.name, json.loads(args.params), prof, prof.schedule)
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    log = logging.getLogger("tilelang")
    level = log.level
    nvcc.compile_cuda = verbose_compile
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    was_cached = tilelang.is_cache_enabled()
    tilelang.disable_cache()   # a cache hit would run no nvcc, hence print nothing
    try:   # restored afterwards: a caller in the same process compiles as before
        tilelang.compile(spec.build(v), target=prof.target, execution_backend=BACKEND,
                         pass_configs=spec.pass_configs(v))
    finally:
        if was_cached:
            tilelang.enable_cache()
        nvcc.compile_cuda = orig
        log.removeHandler(handler)
        log.setLevel(level)
    lines = [ln.strip() for ln in buf.getvalue().splitlines()
             if "registers" in ln or "spill" in ln or "Compiling entry" in ln or "stack" in ln]
    print(f"{v.name} for {prof.name}")
    for ln in lines:
        print("  " + ln)
    return 0 if any("registers" in ln for ln in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
