"""KV compressor benchmark: `compressor_compress` (gather a window of state rows, softmax-pool, RMSNorm, RoPE, fp8
quantize, write one compressed slot) at every compressor site of V4-Flash (ratio 4 attention KV d 512, ratio 4
indexer keys d 128, ratio 128 attention KV d 512), for T tokens of which E complete a window.

Inputs are the family's GPU-case inputs (kernels/compressor/family.py: a shuffled paged state cache, about two of
three tokens emitting, every fifth without an output slot). Time = one CUDA-graph replay of the op, L2 flushed
before it (benchmarks/harness.py: graph_us_or_reason). GB/s counts the state bytes the emitting tokens read (window rows
x their kv and score halves x 4 B) over that time: the ratio-4 sites read 8 rows per emitting token, ratio 128 reads
128.

    python benchmarks/compressor/bench_compressor.py --out bench_out/compressor.json [--tokens 1 8 64 512]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.* imports
from benchmarks.harness import copy_bandwidth_gbs, graph_us_or_reason, write_rows  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 512])
    ap.add_argument("--model", default="deepseek-v4-flash")
    ap.add_argument("--arch", default=None, help="schedule to run: native (default) or sm_120a (emulated)")
    ap.add_argument("--label", default="", help="a tag stored with every row (e.g. the code version)")
    ap.add_argument("--out", default="bench_out/compressor.json")
    args = ap.parse_args()

    import dsv4_jit
    from dsv4_jit.arch import detect_arch, get_profile
    from dsv4_jit.model_config import load_model_config
    from dsv4_jit.kernels.compressor import family, reference

    native = detect_arch()
    arch = native if args.arch in (None, native.name) else get_profile(args.arch).emulated(native)
    m = load_model_config(args.model)
    eps = float(m.rms_norm_eps)
    copy = copy_bandwidth_gbs()
    print(f"{torch.cuda.get_device_name()}; schedule {arch.schedule} on {native.name}; copy bandwidth {copy:,.0f} GB/s")
    print(f"{'site':>22} {'T':>5} {'emit':>5} {'us':>9} {'GB/s':>8} {'%copy':>6}")
    rows = []
    g = torch.Generator().manual_seed(0)
    for ratio, d, label in family.compressor_sites(m):
        case = family._compress_case(m, ratio, d)
        w = reference.coff_of(ratio) * ratio
        for t in args.tokens:
            inp = case.make_inputs(t, "cuda", g)
            cache = inp["fill"].clone()

            def step():
                dsv4_jit.compressor_compress(inp["state"], inp["sbt"], inp["pos"], inp["req"], inp["slots"],
                                             inp["w"], inp["cos_sin"], cache, ratio=ratio,
                                             state_page=family.STATE_PAGE, block_size=family.CACHE_BLOCK, eps=eps,
                                             arch=arch)
            step()
            torch.cuda.synchronize()
            emit = int((((inp["pos"] + 1) % ratio == 0) & (inp["slots"] >= 0)).sum())
            us, why = graph_us_or_reason(step, reps=1)
            nbytes = emit * w * 2 * d * 4
            gbs = nbytes / (us * 1e3) if us else None
            row = {"site": label, "ratio": ratio, "head_dim": d, "tokens": t, "emitting": emit, "us": us,
                   "why": why, "state_bytes": nbytes, "gbs": gbs, "pct_copy": 100 * gbs / copy if gbs else None,
                   "label": args.label}
            rows.append(row)
            site = f"r{ratio} d{d}"
            print(f"{site:>22} {t:>5} {emit:>5} {us if us is None else round(us, 1):>9} "
                  f"{'' if gbs is None else round(gbs, 1):>8} {'' if gbs is None else round(row['pct_copy'], 1):>6}",
                  flush=True)
    write_rows(args.out, rows, schedule=arch.schedule, copy_gbs=copy, model=args.model)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
