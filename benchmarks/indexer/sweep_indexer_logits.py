"""Grid and ring sweep for `indexer_decode_logits`: the logits kernel's target CTAs per SM (logits.CTAS_PER_SM: the
grid holds at least that many CTAs an SM, in whole waves of what the SMs hold; DECODE_MAX_TILES_PER_CTA raises it for
large batch) and its cp.async ring depth (--stages), timed at bench_indexer's points, each output checked against
bench_indexer's torch logits. Each value is a separate variant (kernel parameters), compiled on first use.

    python benchmarks/indexer/sweep_indexer_logits.py --ctas-per-sm 2 4 8 --stages 2 3 --out bench_out/sweep_indexer_logits.json
    python benchmarks/indexer/sweep_indexer_logits.py --forms f16 --stages 2 --ctas-per-sm 4 -j 4 --contexts 8192 65536 262144
    python benchmarks/indexer/sweep_indexer_logits.py --forms fp8 --stages 2 3 4 --ctas-per-sm 4 -j 6 --contexts 8192 65536 262144

--forms (GPUs with WGMMA): `f16` converts each fp8 K tile to f16 for f16 WGMMA, `fp8` runs fp8 WGMMA on the bytes as
they arrive (logits.FP8_WGMMA); each row prints its errors (relative to the row's largest logit, and the GPU cases'
per-token metric) next to its time. -j compiles every variant first, in parallel.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.* imports
from benchmarks.indexer.bench_indexer import PAGE, RATIO, cold_us, make_inputs, torch_logits  # noqa: E402
from benchmarks.harness import copy_bandwidth_gbs, write_rows  # noqa: E402


def logits_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Worst |out - ref| over the valid columns, relative to the row's largest |ref|; inf where the -inf columns
    (past each request's length) differ."""
    valid = torch.isfinite(ref)
    if not torch.equal(valid, torch.isfinite(out)):
        return float("inf")
    scale = ref.where(valid, 0).abs().amax(1, keepdim=True).clamp_min(1e-30)
    return float(((out - ref).where(valid, 0).abs() / scale).max())


def token_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """The GPU cases' metric (dsv4_jit.testing.per_token_rel_err) over the valid columns: the worst token's
    ||out - ref|| / ||ref||; inf where the -inf columns differ."""
    from dsv4_jit.testing import per_token_rel_err
    valid = torch.isfinite(ref)
    if not torch.equal(valid, torch.isfinite(out)):
        return float("inf")
    return per_token_rel_err(out.where(valid, 0), ref.where(valid, 0))[0]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctas-per-sm", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--contexts", type=int, nargs="+", default=[65536, 262144])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--max-tiles", type=int, default=None, help="logits.DECODE_MAX_TILES_PER_CTA of this GPU's "
                    "schedule family for every run (default: the module's); a large value reproduces the "
                    "CTAS_PER_SM-only grid")
    ap.add_argument("--stages", type=int, nargs="+", default=[None], help="the cp.async ring depth of this GPU's "
                    "schedule family (logits.SCHEDULES; default: the module's)")
    ap.add_argument("--forms", nargs="+", default=[None], choices=[None, "f16", "fp8"],
                    help="the WGMMA operand form on a GPU with WGMMA (default: the module's)")
    ap.add_argument("-j", "--jobs", type=int, default=0, help="compile every variant first with this many processes")
    ap.add_argument("--out", default="bench_out/sweep_indexer_logits.json")
    args = ap.parse_args()

    import dsv4_jit
    from dsv4_jit import jit
    from dsv4_jit.arch import detect_arch
    from dsv4_jit.kernels.indexer import logits as lg_mod
    from dsv4_jit.kernels.indexer import ops
    from dsv4_jit.spec import get_spec
    arch = detect_arch()
    bw = copy_bandwidth_gbs()
    width = max(args.contexts) // RATIO + 64
    g = torch.Generator(device="cuda").manual_seed(0)
    points = [(ctx, b, make_inputs(b, ctx, width, g)) for ctx in args.contexts for b in args.batch]
    rows, refs = [], {}
    print(f"{torch.cuda.get_device_name()}; copy bandwidth {bw:,.0f} GB/s")
    base = lg_mod.SCHEDULES[arch.family]
    base_fp8 = lg_mod.FP8_WGMMA.get(arch.family, False)
    configs = [(c, ns, form) for form in args.forms for ns in args.stages for c in args.ctas_per_sm]

    def configure(c, ns, form):
        lg_mod.CTAS_PER_SM = c
        lg_mod.SCHEDULES[arch.family] = (base[0], ns or base[1], base[2])
        lg_mod.FP8_WGMMA[arch.family] = base_fp8 if form is None else form == "fp8"
        if args.max_tiles:
            lg_mod.DECODE_MAX_TILES_PER_CTA[arch.family] = args.max_tiles
        jit._SELECT_MEMO.clear()   # select reads the constants: drop the memoised variants
        return get_spec("indexer_decode_logits").select(arch, ops.decode_static(64, 128, 1, PAGE), 1)

    if args.jobs:
        from benchmarks.harness import compile_variants
        compile_variants([configure(*cfg) for cfg in configs], arch.name, args.jobs)
    for c, ns, form in configs:
        v = configure(c, ns, form)
        print(f"variant {v.name}", flush=True)
        for ctx, b, d in points:
            out = torch.empty(b, width, dtype=torch.float32, device="cuda")
            info = torch.empty(b, 3, dtype=torch.int32, device="cuda")
            a = (d["q"], d["q_scale"], d["weights"], d["kv_cache"], d["seq_lens"], d["block_table"])
            us, why = cold_us(lambda: dsv4_jit.indexer_decode_logits(*a, out=out, row_info=info, next_n=1, arch=arch))
            ref = refs.setdefault((ctx, b), torch_logits(d, torch.empty_like(out)))
            err, tok_err = logits_error(out, ref), token_error(out, ref)
            kbytes = b * d["comp"] * 132
            pct = 100 * kbytes / (us * 1e-6) / 1e9 / bw if us else None
            rows.append({"ctas_per_sm": c, "stages": v.p["stages"], "operand": v.p["operand"],
                         "slots": v.p.get("slots"), "max_tiles": v.p["max_tiles"], "ctx": ctx, "batch": b, "us": us,
                         "why": why, "pct_copy": pct, "max_rel_err": err, "max_token_rel_err": tok_err})
            print(f"{v.p['operand']:>11} CTAS_PER_SM={c:>2} stages={v.p['stages']} ctx={ctx:>6} B={b:>2}: "
                  f"{us:7.1f} us  {pct:5.1f}% of copy  err {err:.1e} (per token {tok_err:.1e})", flush=True)
    write_rows(args.out, rows, width=width)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
