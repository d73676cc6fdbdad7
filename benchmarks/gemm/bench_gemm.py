"""FP8 block-scaled GEMM benchmark: every FP8 weight shape of a model at one TP (derived from its config by
kernels/gemm/family.py: gemm_shapes), at decode sizes (M = 1, 8, 32, 64) and prefill sizes (M = 2048, 8192).

Columns (us: one call per CUDA-graph replay, median of triton's do_bench, L2 flushed before each replay, so
a weight is read from DRAM every call, as in a forward pass where 43+ layers' weights pass through L2):
  ours            dsv4_jit.fp8_gemm (TileLang; split-K + reduce where the variant splits), with the variant name
  GB/s, %copy     decode rows: weight bytes (fp8 N x K + fp32 block scales) / time, and that against a measured
                  device-to-device copy (256 MiB, read + write): how close the GEMM streams the weight to bandwidth
  TFLOP/s         prefill rows: 2 * M * N * K / time
  torch           torch._scaled_mm with the SAME scaling (A 1x128 per-token groups, B 128x128 blocks) where this
                  torch/GPU supports it ("blockwise"); otherwise with ROWWISE scaling (scale_a [M, 1], scale_b [1, N]:
                  a cheaper, NOT equivalent scaling, shown as a speed reference, marked "rowwise"); otherwise the
                  reason. torch._scaled_mm needs M, N, K multiples of 16 for the rowwise path: smaller M is padded to
                  16 and marked "pad16". The grouped wo_a runs as `groups` torch calls in one graph.
  ours/L, %copy/L, torch/L   decode rows: --layers (8) distinct copies of the weight run back to back in one graph,
                  per GEMM: what a forward pass's successive layers see (no L2 reuse; the ~5 us floor of timing one
                  launch by itself is paid once per graph, not per GEMM; our decode ring GEMMs are PDL-launched)
  q/L, q+ours/L   decode rows: act_quant_fp8 of the bf16 activation alone, and act_quant_fp8 then ours, per layer
What torch supports is probed once per run and printed (torch 2.x: per-tensor and rowwise fp32 scales on sm_89+;
blockwise 1x128 x 128x128 only on newer torch builds for sm_90 / sm_100, not on SM12x).

    python benchmarks/gemm/bench_gemm.py --out bench_out/gemm.json [--model deepseek-v4-flash] [--tp 1]
        [--decode 1 8 32 64] [--prefill 2048 8192] [--arch sm_120a]  (an SM120 schedule emulated on this GPU)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.* imports
from benchmarks.harness import copy_bandwidth_gbs, graph_us_or_reason, run_info  # noqa: E402



def _reason(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]


# Scale layouts tried for torch's blockwise path (torch builds differ); the first whose result matches the
# float64 reference is used.
_BLOCK_LAYOUTS = {
    "sa row-major, sb [N/128, K/128]": (lambda x: x, lambda y: y),
    "sa column-major, sb [N/128, K/128]": (lambda x: x.t().contiguous().t(), lambda y: y),
    "sa column-major, sb [K/128, N/128] view": (lambda x: x.t().contiguous().t(), lambda y: y.t()),
    "sa column-major, sb [K/128, N/128]": (lambda x: x.t().contiguous().t(), lambda y: y.t().contiguous()),
}
_LAYOUT = {"blockwise": next(iter(_BLOCK_LAYOUTS))}


def torch_scaled_mm(a, sa, b, sb, groups: int, mode: str, outs_ref: list | None = None):
    """One call per group of torch._scaled_mm at `mode` ('blockwise' or 'rowwise'); returns a callable."""
    m, gk = a.shape
    k = gk // groups
    n = b.shape[0] // groups
    nq = sb.shape[0] // groups
    calls = []
    for g in range(groups):
        ag = a[:, g * k:(g + 1) * k].contiguous()
        bg = b[g * n:(g + 1) * n]                    # [N, K] row-major: bg.t() is column-major [K, N]
        if mode == "blockwise":
            fa, fb = _BLOCK_LAYOUTS[_LAYOUT["blockwise"]]
            calls.append((ag, bg.t(), fa(sa[:, g * (k // 128):(g + 1) * (k // 128)].contiguous()),
                          fb(sb[g * nq:(g + 1) * nq].contiguous())))
        else:
            pad = (-m) % 16
            if pad:
                ag = torch.cat([ag, ag.new_zeros(pad, k)])
            sag = torch.ones(ag.shape[0], 1, dtype=torch.float32, device=a.device)
            sbg = torch.ones(1, n, dtype=torch.float32, device=a.device)
            calls.append((ag, bg.t(), sag, sbg))
    outs = [torch.empty(c[0].shape[0], n, dtype=torch.bfloat16, device=a.device) for c in calls]
    if outs_ref is not None:
        outs_ref.extend(outs)

    def run():
        for (x, w, s1, s2), o in zip(calls, outs):
            torch._scaled_mm(x, w, scale_a=s1, scale_b=s2, out_dtype=torch.bfloat16, out=o)
    return run


def probe_torch(dev) -> dict:
    """Which torch._scaled_mm scalings run here (small shapes); blockwise counts only when its result matches
    the float64 reference of the block-scaled math (value None = supported, else the reason)."""
    from dsv4_jit.kernels.gemm.reference import quantize_weight_blocks, ref_fp8_gemm
    from dsv4_jit.kernels.quant.reference import ref_act_quant_fp8
    a, sa = ref_act_quant_fp8((torch.randn(128, 512, device=dev) * torch.rand(128, 1, device=dev) * 4)
                              .to(torch.bfloat16))
    b, sb = quantize_weight_blocks(torch.randn(256, 512, device=dev) * torch.exp(torch.randn(256, 1, device=dev)))
    want = ref_fp8_gemm(a, sa, b, sb)
    out = {"blockwise": "no scale layout ran"}
    for name in _BLOCK_LAYOUTS:
        _LAYOUT["blockwise"] = name
        try:
            got: list = []
            torch_scaled_mm(a, sa, b, sb, 1, "blockwise", got)()
            torch.cuda.synchronize()
            err = float((got[0].double() - want).norm() / want.norm())
            if err < 1e-2:
                out["blockwise"] = None
                out["blockwise_layout"] = name
                break
            out["blockwise"] = f"runs but wrong result with {name} (rel err {err:.2e})"
        except Exception as e:  # unsupported on this torch / GPU: say why
            out["blockwise"] = _reason(e)
            torch.cuda.synchronize()
    try:
        torch_scaled_mm(a, sa, b, sb, 1, "rowwise")()
        torch.cuda.synchronize()
        out["rowwise"] = None
    except Exception as e:  # unsupported on this torch / GPU: say why
        out["rowwise"] = _reason(e)
        torch.cuda.synchronize()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="deepseek-v4-flash")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--decode", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--prefill", type=int, nargs="*", default=[2048, 8192])
    ap.add_argument("--arch", default=None, help="schedule to run: native (default) or sm_120a (emulated)")
    ap.add_argument("--layers", type=int, default=8, help="decode rows also time this many distinct copies of the "
                    "weight back to back in one graph (a forward pass's successive layers: no L2 reuse, and no "
                    "single-launch timer floor), reported per GEMM; 0 = off")
    ap.add_argument("--out", default="bench_out/gemm.json")
    args = ap.parse_args()

    import dsv4_jit
    from dsv4_jit.arch import detect_arch, get_profile
    from dsv4_jit.kernels.gemm import ops as gops
    from dsv4_jit.kernels.gemm.family import gemm_shapes, make_activations, make_weights
    from dsv4_jit.model_config import load_model_config
    from dsv4_jit.spec import get_spec
    native = detect_arch()
    arch = native if args.arch is None else (get_profile(args.arch) if get_profile(args.arch).family == native.family
                                             else get_profile(args.arch).emulated(native))
    dev = torch.device("cuda")
    model = load_model_config(args.model)
    shapes = gemm_shapes(model, args.tp)
    bw = copy_bandwidth_gbs()
    support = probe_torch(dev)
    mode = "blockwise" if support["blockwise"] is None else ("rowwise" if support["rowwise"] is None else None)
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; schedule {arch.schedule} on {arch.name}; "
          f"copy bandwidth {bw:,.0f} GB/s; {args.model} TP{args.tp}")
    for k_, v_ in support.items():
        if k_ == "blockwise_layout":
            print(f"  blockwise scale layout: {v_}")
            continue
        print(f"  torch._scaled_mm {k_}: {'supported' if v_ is None else 'unsupported (' + v_ + ')'}")
    print(f"{'shape':<44} {'M':>5} {'ours us':>8} {'GB/s':>7} {'%copy':>6} {'TFLOP/s':>8} {'torch us':>9} "
          f"{'torch':>16} {'ours/L':>8} {'%copy/L':>6} {'torch/L':>8} {'q/L':>7} {'q+ours/L':>7}  variant   "
          f"(/L: per layer of --layers)")
    rows = []
    g = torch.Generator(device=dev).manual_seed(0)
    for s in shapes:
        n, k, groups = s["n"], s["k"], s["groups"]
        b, sb = make_weights(groups, n, k, g, dev)
        wbytes = b.numel() + sb.numel() * 4
        copies = [(b, sb)] + [(b.clone(), sb.clone()) for _ in range(max(0, args.layers - 1))]
        for m in list(args.decode) + list(args.prefill):
            a, sa = make_activations(m, groups * k, g, dev)
            c = torch.empty(m, groups * n, dtype=torch.bfloat16, device=dev)
            ws = torch.empty(max(1, gops.fp8_gemm_workspace_numel(n, k, m, arch=arch, groups=groups)),
                             dtype=torch.float32, device=dev)
            fn = lambda: dsv4_jit.fp8_gemm(a, sa, b, sb, arch=arch, groups=groups, out=c, workspace=ws)  # noqa: E731
            fn()
            us, why = graph_us_or_reason(fn, reps=1)
            variant = get_spec("fp8_gemm").select(arch, gops.gemm_static(n, k, groups), m).name
            t_us, t_note = None, support.get("blockwise") if mode is None else mode
            if mode is not None:
                try:
                    t_fn = torch_scaled_mm(a, sa, b, sb, groups, mode)
                    t_us, t_why = graph_us_or_reason(t_fn, reps=1)
                    if t_us is None:
                        t_note = t_why
                    elif mode == "rowwise" and m % 16:
                        t_note = "rowwise pad16"
                except Exception as e:  # shape unsupported by torch: say why
                    t_note = _reason(e)
            flops = 2.0 * m * groups * n * k
            gbs = wbytes / (us * 1e-6) / 1e9 if us else None
            row = {"shape": s["label"], "n": n, "k": k, "groups": groups, "m": m, "ours_us": us, "ours_error": why,
                   "variant": variant, "weight_bytes": wbytes, "gbs": gbs, "pct_copy": 100 * gbs / bw if gbs else None,
                   "tflops": flops / (us * 1e-6) / 1e12 if us else None, "torch_us": t_us, "torch_mode": t_note,
                   "torch_tflops": flops / (t_us * 1e-6) / 1e12 if t_us else None}
            if m <= 64 and args.layers > 1:
                L = len(copies)
                lus, _ = graph_us_or_reason(lambda: [dsv4_jit.fp8_gemm(a, sa, w, ws_, arch=arch, groups=groups, out=c,
                                                                        workspace=ws) for w, ws_ in copies], reps=1)
                row["layers"] = L
                row["ours_per_layer_us"] = lus / L if lus else None
                row["pct_copy_per_layer"] = 100 * wbytes / (lus / L * 1e-6) / 1e9 / bw if lus else None
                # a decode layer's quantize-then-GEMM pair, L times, against the two measured apart: any launch
                # overlap between them shows as the pair costing less (none measured, 2026-11-24)
                x = torch.randn(m, groups * k, generator=g, device=dev).to(torch.bfloat16)
                aq, saq = torch.empty_like(a), torch.empty_like(sa)
                quant = lambda: dsv4_jit.act_quant_fp8(x, arch=arch, out=aq, scales=saq)  # noqa: E731
                q_us, _ = graph_us_or_reason(lambda: [quant() for _ in copies], reps=1)
                qg_us, _ = graph_us_or_reason(lambda: [(quant(), dsv4_jit.fp8_gemm(
                    aq, saq, w, ws_, arch=arch, groups=groups, out=c, workspace=ws)) for w, ws_ in copies], reps=1)
                row["quant_per_layer_us"] = q_us / L if q_us else None
                row["quant_gemm_per_layer_us"] = qg_us / L if qg_us else None
                if mode is not None and t_us is not None:
                    try:
                        runs = [torch_scaled_mm(a, sa, w, ws_, groups, mode) for w, ws_ in copies]
                        tl_us, _ = graph_us_or_reason(lambda: [r() for r in runs], reps=1)
                        row["torch_per_layer_us"] = tl_us / L if tl_us else None
                    except Exception as e:  # shape unsupported by torch: already noted
                        row["torch_per_layer_error"] = _reason(e)
            rows.append(row)
            label = f"{s['label'][:24]} {groups * k}->{groups * n}"
            dec = m <= 64

            def f(v, w, p):
                return f"{v:>{w}.{p}f}" if v is not None else f"{'-':>{w}}"
            print(f"{label:<44} {m:>5} {f(us, 8, 1)} {f(gbs if dec else None, 7, 0)} "
                  f"{f(row['pct_copy'] if dec else None, 6, 1)} {f(row['tflops'] if not dec else None, 8, 1)} "
                  f"{f(t_us, 9, 1)} {str(t_note or '')[:16]:>16} {f(row.get('ours_per_layer_us'), 8, 1)} "
                  f"{f(row.get('pct_copy_per_layer'), 6, 1)} {f(row.get('torch_per_layer_us'), 8, 1)} "
                  f"{f(row.get('quant_per_layer_us'), 7, 1)} {f(row.get('quant_gemm_per_layer_us'), 7, 1)}  "
                  f"{variant.split('@')[0]}")
            del a, sa, c, ws
        del copies
        torch.cuda.empty_cache()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), **run_info(), "torch": torch.__version__,
                               "schedule": arch.schedule, "arch": arch.name, "model": args.model, "tp": args.tp,
                               "copy_gbs": bw, "torch_scaled_mm_support": support, "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
