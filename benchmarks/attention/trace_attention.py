"""Where a sparse MLA decode kernel's time goes inside its CTAs: select's variant built with timeline stamps
(`trace=True`: %globaltimer and %clock64 at fixed points of one thread of each CTA, kernels/attention/trace.py), run
as bench_attention runs it (one CUDA graph over --layers distinct input sets, L2 flushed before the replay,
the layers chained by PDL), then per stamp the CTAs' spread in ns from the layer's first release from the
grid-dependency sync.

    python benchmarks/attention/trace_attention.py --heads 64 --batch 1 8 64 --ctx 65536 --ratio 4

The stamps are few stores of one thread; the traced kernel's own time is printed beside the untraced op's so
their cost shows. Outputs are checked against float64 as in the other attention benchmarks.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.* imports
from benchmarks.attention.bench_attention import make_point  # noqa: E402
from benchmarks.harness import compile_variants, graph_us_or_reason, schedule_profile, write_rows  # noqa: E402

from dsv4_jit.kernels.attention import ops, reference  # noqa: E402
from dsv4_jit.kernels.attention.sparse_mla import D, combine_for  # noqa: E402
from dsv4_jit.testing import per_token_rel_err  # noqa: E402


def parse_set(text: str) -> dict:
    """'k=v,k2=v2' -> {k: v, ...} (ints and true / false parsed); '' -> {} (select's variant as it is)."""
    out = {}
    for item in filter(None, text.split(",")):
        k, _, v = item.partition("=")
        out[k] = int(v) if v.lstrip("-").isdigit() else {"true": True, "false": False}.get(v, v)
    return out


def select_variant(prof, heads: int, batch: int, extra: dict | None = None):
    """select's forward variant at this point, with `extra` params over its own."""
    from dsv4_jit.spec import Variant
    st = ops._static(heads, D ** -0.5, "fp8_ds_mla")
    return Variant.make(ops._FWD.name, {**ops._FWD.select(prof, st, batch).p, **(extra or {})}, prof)


def traced_variant(plain):
    """(plain with trace=True, its stamp names)."""
    from dsv4_jit.spec import Variant
    p = plain.p
    if not p.get("warp_specialized") and not p.get("stages"):
        raise ValueError(f"{plain.name}: the register-path kernel has no stamps")
    from dsv4_jit.kernels.attention.decode import RING_STAMPS
    from dsv4_jit.kernels.attention.decode_ws import WS_STAMP_NAMES
    names = WS_STAMP_NAMES if p.get("warp_specialized") else RING_STAMPS
    return Variant.make(ops._FWD.name, {**p, "trace": True}, plain.profile), names


class WithTrace:
    """The traced kernel as the op calls a kernel (its variant, then its arguments), the stamps' buffer appended."""

    def __init__(self, kernel, buf: torch.Tensor):
        self.kernel, self.buf, self.variant = kernel, buf, kernel.variant

    def __call__(self, *args):
        return self.kernel(*args, self.buf)


def flush_l2() -> None:
    buf = getattr(flush_l2, "buf", None)
    if buf is None:
        buf = flush_l2.buf = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    buf.zero_()


def summarize(traces: list[torch.Tensor], names) -> dict:
    """Per stamp: median / max over the CTAs that reached it of (stamp - the layer's first pdl_sync release), ns
    (%globaltimer: 256 ns steps on Hopper), and the median over them of (its %clock64 - the CTA's own pdl_sync's) at
    the SM clock the stamps imply, ns (exact within a CTA); per layer the span from that release to its last stamp."""
    per_stamp: dict[str, list[float]] = {n: [] for n in names}
    per_clock: dict[str, list[float]] = {n: [] for n in names}
    spans, gaps, clocks = [], [], []
    prev_end = None
    rel = names.index("pdl_sync")
    for tr in traces:
        g = tr[..., 0].reshape(-1, len(names)).double()   # [CTAs, stamps] globaltimer ns, 0 = not reached
        c = tr[..., 1].reshape(-1, len(names)).double()
        reached = g > 0
        t0 = g[:, rel][reached[:, rel]].min()
        end = g[reached].max()
        spans.append(float(end - t0))
        if prev_end is not None:
            gaps.append(float(t0 - prev_end))
        prev_end = end
        for k, n in enumerate(names):
            v = g[reached[:, k], k] - t0
            per_stamp[n].extend(v.tolist())
        first = reached[:, 0]
        last_k = max(k for k in range(len(names)) if reached[:, k].any())
        both = first & reached[:, last_k]
        dg, dc = g[both, last_k] - g[both, 0], c[both, last_k] - c[both, 0]
        ok = dg > 2000
        if ok.any():
            clocks.append(float((dc[ok] / dg[ok]).median()))
            for k, n in enumerate(names):
                mine = reached[:, k] & reached[:, rel]
                per_clock[n].extend(((c[mine, k] - c[mine, rel]) / clocks[-1]).tolist())
    out = {"stamps": {}, "layer_span_ns": statistics.median(spans),
           "launch_gap_ns": statistics.median(gaps) if gaps else None,
           "sm_ghz": statistics.median(clocks) if clocks else None}
    for n, v in per_stamp.items():
        if v:
            v.sort()
            cv = sorted(per_clock[n])
            out["stamps"][n] = {"ctas": len(v) // len(traces), "median_ns": v[len(v) // 2], "max_ns": v[-1],
                                "min_ns": v[0], "clock_median_ns": cv[len(cv) // 2] if cv else None}
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, nargs="+", default=[64])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--ctx", type=int, default=65536)
    ap.add_argument("--ratio", type=int, default=4)
    ap.add_argument("--schedule", default="sm_90a", choices=["sm_90a", "sm_120a"])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--set", nargs="+", default=[""], dest="sets",
                    help="variant params over select's, one configuration each ('' = select's), e.g. gather_ld=cg")
    ap.add_argument("--no-trace", action="store_true", help="time the op and check it only (no traced build)")
    ap.add_argument("--replays", type=int, default=5, help="graph replays (L2 flushed before each); the last is kept")
    ap.add_argument("-j", "--jobs", type=int, default=0, help="compile every variant first with this many processes")
    ap.add_argument("--out", default="bench_out/trace_attention.json")
    args = ap.parse_args()

    from dsv4_jit import jit
    prof = schedule_profile(args.schedule, "sm_90a")
    scale = D ** -0.5
    points = [(h, b, parse_set(x)) for h in args.heads for b in args.batch for x in args.sets]
    if args.jobs:
        jobs = []
        for h, b, x in points:
            plain = select_variant(prof, h, b, x)
            jobs += [plain, combine_for(prof, plain, b)]
            if not args.no_trace:
                jobs.append(traced_variant(plain)[0])
        compile_variants(jobs, "sm_90a", args.jobs)
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    print(f"{torch.cuda.get_device_name()}; {args.schedule} schedule; ratio {args.ratio}, {args.ctx // 1024}K; "
          f"{args.layers} layers a graph, L2 flushed; ns from the layer's first grid-dependency release")
    fmt = lambda x: f"{x:7.2f}" if x is not None else "   fail"  # noqa: E731
    for heads, batch, extra in points:
        plain = select_variant(prof, heads, batch, extra)
        traced, names = (None, ()) if args.no_trace else traced_variant(plain)
        pts = [make_point(batch, heads, args.ctx, args.ratio, g) for _ in range(args.layers)]
        grid = (batch, -(-heads // plain.p["head_block"]), plain.p["n_splits"])
        bufs = [torch.zeros(*grid, len(names), 2, dtype=torch.int64, device="cuda") for _ in pts]
        k_traced = None if traced is None else jit.load(ops._FWD, traced)

        def getter(buf=None):
            def get(spec, static, n):
                if spec.name != ops._FWD.name:
                    return jit.load(spec, combine_for(prof, plain, n))
                return jit.load(spec, plain) if buf is None else WithTrace(k_traced, buf)
            return get

        def op_call(p, get):
            (c1, i1, l1, bs1), (c2, i2, l2, bs2) = p["lists"]
            out = torch.empty_like(p["q"])
            # the variant's own (a --set split count may exceed select's)
            ws = torch.empty(max(1, ops.variant_workspace_numel(plain, batch)), device="cuda")

            def call():
                ops.sparse_mla_decode(p["q"], c1, i1, l1, p["sink"], block_size=bs1, extra_kv_cache=c2,
                                      extra_indices=i2, extra_lengths=l2, extra_block_size=bs2, out=out, workspace=ws,
                                      check_indices=False, arch=prof, get_kernel=get)
            return call, out

        plain_calls = [op_call(p, getter()) for p in pts]
        plain_calls[0][0]()
        torch.cuda.synchronize()
        (c1, i1, l1, bs1), (c2, i2, l2, bs2) = pts[0]["lists"]
        ref = reference.ref_sparse_mla(pts[0]["q"], reference.unpack_fp8_ds_mla(c1, bs1), i1, l1,
                                       reference.unpack_fp8_ds_mla(c2, bs2), i2, l2, pts[0]["sink"], scale)
        err = per_token_rel_err(plain_calls[0][1], ref)[0]
        us_plain, why = graph_us_or_reason(lambda: [c() for c, _ in plain_calls], reps=1)
        row = {"heads": heads, "batch": batch, "params": extra, "ratio": args.ratio, "ctx": args.ctx,
               "schedule": args.schedule, "variant": plain.name, "grid": list(grid),
               "us_a_layer": None if us_plain is None else us_plain / len(pts), "why": why, "max_token_rel_err": err}
        if traced is None:
            rows.append(row)
            write_rows(args.out, rows, partial=True)
            print(f"H{heads} x {batch} ({plain.name}; grid {grid}): op {fmt(row['us_a_layer'])} us a layer; "
                  f"err {err:.1e}", flush=True)
            continue
        calls = [op_call(p, getter(buf)) for p, buf in zip(pts, bufs)]
        us_traced, _ = graph_us_or_reason(lambda: [c() for c, _ in calls], reps=1)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for c, _ in calls:
                c()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for c, _ in calls:
                c()
        for _ in range(args.replays):
            for b in bufs:
                b.zero_()
            flush_l2()
            graph.replay()
        torch.cuda.synchronize()
        summ = summarize([b.cpu() for b in bufs], names)
        row.update({"traced_us_a_layer": None if us_traced is None else us_traced / len(pts), **summ})
        rows.append(row)
        write_rows(args.out, rows, partial=True)
        print(f"\nH{heads} x {batch} ({plain.name}; grid {grid}): op {fmt(row['us_a_layer'])} us a layer, traced "
              f"{fmt(row['traced_us_a_layer'])}; err {err:.1e}; forward span {summ['layer_span_ns'] / 1e3:.2f} us, "
              f"previous layer's last stamp -> this layer's first release "
              f"{(summ['launch_gap_ns'] or 0) / 1e3:.2f} us; SM clock {summ['sm_ghz'] or 0:.2f} GHz", flush=True)
        print(f"  {'stamp':<28} {'CTAs':>5} {'min':>8} {'median':>8} {'max':>8} {'clock':>8}  (us; clock: the CTA's "
              f"own %clock64 from its release, median)")
        for n, v in summ["stamps"].items():
            ck = v["clock_median_ns"]
            print(f"  {n:<28} {v['ctas']:>5} {v['min_ns'] / 1e3:8.2f} {v['median_ns'] / 1e3:8.2f} "
                  f"{v['max_ns'] / 1e3:8.2f} {'-' if ck is None else f'{ck / 1e3:8.2f}':>8}")
    write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
