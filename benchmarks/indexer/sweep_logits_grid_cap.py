"""The decode logits grid's tile cap (`max_tiles`: no CTA walks more than this many tiles, which sets the CTAs a row
once the batch is large) against the schedule's own, per layer as bench_indexer times it: one CUDA graph over
--layers distinct input sets (L2 flushed before each replay), graph time / layers, the caps alternated and the median
of --reps taken. Three timings a cap: the logits without the -inf fill (what the indexer step runs), with it, and
the step (logits + top-k 512). Every cap's logits (with the fill) and top-k sets are compared with the first cap's:
the cap moves work between CTAs, never the arithmetic, so they must be identical.

    python benchmarks/indexer/sweep_logits_grid_cap.py --caps 32 1024 --contexts 8192 65536 --batch 16 32 64 128 \\
        --schedules sm_90a sm_120a --out bench_out/sweep_logits_grid_cap.json

The width is bench_indexer's (256K context / 4 + 64 columns, a CUDA graph captured for max_model_len); a schedule
other than this GPU's is compiled for it (sm_120a on an H100: SM12x's grid is sized for its own SM count).
"""
from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.* imports
from benchmarks.harness import compile_job, schedule_profile  # noqa: E402

HEADS, DIM, PAGE, TOPK, RATIO = 64, 128, 64, 512, 4


def logits_params(schedule: str, clean: bool, cap: int, native: str) -> dict:
    from dsv4_jit.kernels.indexer.ops import decode_static
    from dsv4_jit.spec import get_spec
    spec = get_spec("indexer_decode_logits")
    return {**spec.select(schedule_profile(schedule, native), decode_static(HEADS, DIM, 1, PAGE, RATIO, clean), 1).p,
            "max_tiles": cap}


def compile_all(schedules, caps, batches, native: str, jobs: int) -> None:
    """Every logits variant (both fill forms, every cap) and the top-k kernels the steps select, in parallel."""
    from dsv4_jit.spec import get_spec
    todo = [("indexer_decode_logits", logits_params(s, c, cap, native), native, s)
            for s in schedules for c in (True, False) for cap in caps]
    for name in ("indexer_topk", "indexer_topk_split"):
        spec = get_spec(name)
        for s in schedules:
            for b in batches:
                v = spec.select(schedule_profile(s, native), {"topk": TOPK, "page_size": PAGE}, b)
                todo.append((name, dict(v.p), native, s))
    with ProcessPoolExecutor(jobs) as ex:
        for r in ex.map(compile_job, todo):
            if not r.startswith("compiled"):
                print(r, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--caps", type=int, nargs="+", default=[32, 1024], help="max_tiles values; the first is the "
                    "reference the others' outputs are compared with")
    ap.add_argument("--contexts", type=int, nargs="+", default=[8192, 65536])
    ap.add_argument("--batch", type=int, nargs="+", default=[16, 32, 64, 128])
    ap.add_argument("--schedules", nargs="+", default=None, help="schedules to run (default: this GPU's; another is "
                    "compiled for this GPU)")
    ap.add_argument("--width", type=int, default=262144 // RATIO + 64)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("-j", "--jobs", type=int, default=14)
    ap.add_argument("--out", default="bench_out/sweep_logits_grid_cap.json")
    args = ap.parse_args()
    if any(c < 1 for c in args.caps) or args.layers < 1 or args.reps < 1:
        ap.error("--caps, --layers and --reps must be >= 1")
    if args.width < max(args.contexts) // RATIO:
        ap.error(f"--width {args.width} is below the largest context's {max(args.contexts) // RATIO} columns")

    import torch
    from dsv4_jit import jit
    from dsv4_jit.arch import detect_arch
    from dsv4_jit.jit import kernel_getter
    from dsv4_jit.kernels.indexer import ops
    from dsv4_jit.spec import Variant
    from benchmarks.harness import graph_us_or_reason
    from benchmarks.indexer.bench_indexer import make_inputs
    native = detect_arch().name
    schedules = args.schedules or [native]
    compile_all(schedules, args.caps, args.batch, native, args.jobs)
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    print(f"{torch.cuda.get_device_name()}; {args.layers} layers a graph, median of {args.reps}, us a layer")
    for sched in schedules:
        prof = schedule_profile(sched, native)
        selected = kernel_getter(prof)

        def getter(cap):
            def get(spec, static, t):
                if spec.name != "indexer_decode_logits":
                    return selected(spec, static, t)
                v = spec.select(prof, static, t)
                return jit.load(spec, Variant.make(spec.name, {**v.p, "max_tiles": cap}, prof, sched))
            return get
        for ctx in args.contexts:
            for b in args.batch:
                sets = []
                for _ in range(args.layers):
                    d = make_inputs(b, ctx, args.width, g)
                    sets.append(((d["q"], d["q_scale"], d["weights"], d["kv_cache"], d["seq_lens"], d["block_table"]),
                                 torch.empty(b, args.width, device="cuda"),
                                 torch.empty(b, 3, dtype=torch.int32, device="cuda"),
                                 torch.empty(b, TOPK, dtype=torch.int32, device="cuda"),
                                 torch.empty(b, dtype=torch.int32, device="cuda"),
                                 torch.zeros(ops.indexer_topk_workspace_numel(b), dtype=torch.int32, device="cuda")))
                fns, outs = {}, {}
                for cap in args.caps:
                    kw = dict(next_n=1, arch=prof, get_kernel=getter(cap))

                    def logits(clean, kw=kw):
                        for a, lg, info, *_ in sets:
                            ops.indexer_decode_logits(*a, out=lg, row_info=info, clean=clean, **kw)

                    def step(kw=kw):
                        for a, lg, info, idx, lens, tws in sets:
                            ops.indexer_decode_topk(*a, topk=TOPK, workspace=(lg, info, tws), out=(idx, lens), **kw)
                    logits(True)
                    torch.cuda.synchronize()
                    filled = torch.stack([s[1].clone() for s in sets])
                    step()
                    torch.cuda.synchronize()
                    outs[cap] = (filled, torch.stack([s[3].clone() for s in sets]).sort(-1).values)
                    fns[cap] = {"nofill": lambda f=logits: f(False), "fill": lambda f=logits: f(True), "step": step}
                times = {(cap, k): [] for cap in args.caps for k in ("nofill", "fill", "step")}
                notes = []
                for _ in range(args.reps):
                    for k in ("nofill", "fill", "step"):
                        for cap in args.caps:
                            us, why = graph_us_or_reason(fns[cap][k], reps=1)
                            if us:
                                times[cap, k].append(us / len(sets))
                            if why:
                                notes.append(f"cap {cap} {k}: {why}")
                ref = outs[args.caps[0]]
                row = {"schedule": sched, "ctx": ctx, "batch": b, "width": args.width, "layers": args.layers,
                       # the median of the timed reps; None where no rep could be timed (the notes say why)
                       "us": {f"{cap}/{k}": sorted(v)[len(v) // 2] if v else None for (cap, k), v in times.items()},
                       "identical": {str(cap): bool(torch.equal(o[0], ref[0]) and torch.equal(o[1], ref[1]))
                                     for cap, o in outs.items()},
                       "notes": notes}
                rows.append(row)
                fmt = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
                cells = "  ".join(f"cap {cap}: {fmt(row['us'][f'{cap}/nofill'])} / {fmt(row['us'][f'{cap}/fill'])} / "
                                  f"{fmt(row['us'][f'{cap}/step'])}" for cap in args.caps)
                print(f"{sched} {ctx:>6} x {b:>3} (nofill / fill / step)  {cells}  identical "
                      f"{all(row['identical'].values())}", flush=True)
                write(args.out, rows, args.caps)   # after every point: a later failure keeps the rows timed
                if not all(row["identical"].values()):
                    raise RuntimeError(f"{sched} {ctx} x {b}: a cap changed the logits or the top-k: "
                                       f"{row['identical']}")
                del sets
                torch.cuda.empty_cache()
    print(f"wrote {args.out}")
    return 0


def write(path: str, rows: list, caps: list) -> None:
    import torch
    from benchmarks.harness import run_info
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), **run_info(), "caps": caps, "rows": rows},
                              indent=1))


if __name__ == "__main__":
    sys.exit(main())
