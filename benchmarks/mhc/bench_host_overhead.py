"""Host (CPU) cost per call of the public mHC ops and of their parts, on the GPU machine.

At small T an eager op is bound by the host: do_bench of `dsv4_jit.mhc_pre` at T=1 measures Python +
launch time, not the kernels. This prints microseconds per call for the op and for each piece it is
made of (validation, allocation, views, the kernel launches through tvm_ffi), so the wrapper can be
kept near the floor of its launches. Timing: N back-to-back calls, then one synchronize; per call.

    python benchmarks/mhc/bench_host_overhead.py --out bench_out/host_overhead.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.* imports
from benchmarks.harness import bench_us, host_us, write_rows  # noqa: E402
from benchmarks.mhc.inputs import EPS, HC, ITERS, POST_MULT, H, activations, pre_weights  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--out", default="bench_out/host_overhead.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no GPU: nothing to measure")
        return 0
    import dsv4_jit
    from dsv4_jit import jit
    from dsv4_jit.spec import get_spec
    from dsv4_jit.kernels.mhc import ops as pre_mod
    from dsv4_jit.validate import check_tensor

    dev = "cuda"
    fn, scale, base = pre_weights(None, dev)
    kw = dict(rms_eps=EPS, hc_eps=EPS, sinkhorn_iters=ITERS, post_mult=POST_MULT)
    rows = []
    for t in args.tokens:
        residual, x, post, comb = activations(t, None, dev)
        outs = dsv4_jit.mhc_pre(residual, fn, scale, base, **kw)
        arch = jit.current_arch()
        getter = dsv4_jit.kernel_getter(arch)
        nf_spec = get_spec("mhc_pre_norm_fn")
        fuse_spec = get_spec("mhc_pre_fuse")
        nf_static = {"hidden": H, "hc": HC, "broadcast": False}
        nf = getter(nf_spec, nf_static, t)
        s = nf.variant.p["n_splits"]
        ws = torch.empty(pre_mod.mhc_pre_workspace_numel(t, s, HC), device=dev)
        mix_part = ws[: s * t * 32].view(s, t, 32)
        sq_part = ws[s * t * 32:].view(s, t)
        fuse_static = fuse_spec.statics_for(dsv4_jit.load_model_config("deepseek-v4-flash"))
        fuse_static.update(rms_eps=EPS, hc_eps=EPS, norm_eps=EPS, post_mult=POST_MULT, iters=ITERS)
        fuse = getter(fuse_spec, fuse_static, t)
        x2 = residual.view(t, HC * H)
        small = torch.zeros(16, device=dev)
        items = {
            "public mhc_pre": lambda: dsv4_jit.mhc_pre(residual, fn, scale, base, **kw),
            "public mhc_pre, out+workspace given": lambda: dsv4_jit.mhc_pre(residual, fn, scale, base, out=outs,
                                                                          workspace=ws, **kw),
            "public mhc_post": lambda: dsv4_jit.mhc_post(x, residual, post, comb),
            "norm_fn launch (LoadedKernel)": lambda: nf(x2, fn, mix_part, sq_part),
            "norm_fn launch (tvm_ffi fn)": lambda: nf._fn(x2, fn, mix_part, sq_part),
            "fuse launch (tvm_ffi fn)": lambda: fuse._fn(mix_part, sq_part, residual, scale, base, *outs),
            "torch small op (add_)": lambda: small.add_(1),
            "torch.empty [T,H] bf16": lambda: torch.empty(t, H, dtype=torch.bfloat16, device=dev),
            "residual.view": lambda: residual.view(t, HC * H),
            "workspace slice + view": lambda: ws[: s * t * 32].view(s, t, 32),
            "check_tensor": lambda: check_tensor(residual, "residual", [None, HC, H], torch.bfloat16, residual.device),
            "get_kernel memo hit": lambda: getter(nf_spec, nf_static, t),
            "current_arch + kernel_getter": lambda: dsv4_jit.kernel_getter(jit.current_arch()),
        }
        for name, f in items.items():
            r = {"T": t, "item": name, "host_us": host_us(f)}
            if name.startswith("public"):
                r["do_bench_us"] = bench_us(f)
            rows.append(r)
            print(json.dumps(r), flush=True)
    print(f"\n{torch.cuda.get_device_name()}: host us per call")
    for r in rows:
        extra = f"   (do_bench {r['do_bench_us']:.1f})" if "do_bench_us" in r else ""
        print(f"T={r['T']:<5} {r['item']:40} {r['host_us']:7.2f}{extra}")
    write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
