#!/usr/bin/env python3
"""GPU evidence for the vLLM plugin (no vLLM needed): the routed functions, called with vLLM 0.33's
conventions, give the reference results, with zero compiles after the plugin's warmup.

    python3 scripts/gpu_engine_plugin_check.py [--model deepseek-v4-flash] [--tokens 1,7,32,33,256]

1. builds the plan the plugin builds for a VllmConfig stand-in (max_num_batched_tokens = the largest token
   count) and warms it exactly as the worker hook does (dsv4_jit.warmup, no seal yet), then seals ("error");
2. for each token count builds inputs as vLLM's DeepSeek V4 model passes them (residual [T, hc, H] bf16,
   post mix [T, hc, 1], comb [T, hc, hc], fp32 fn / scale / base, bf16 norm weight) and calls the routes
   of dsv4_jit.engines.vllm_mhc: mhc_pre, the first layer's broadcast, mhc_post, fused post + pre (both the
   fused <= 32-token path and the post + pre path), hc_head;
3. compares every output with kernels/mhc/reference.py (float64) per token (relative error <= 1e-2),
   asserts the returned shapes are vLLM's, and that dsv4_jit.counters() shows no compile after warmup.
Exit 0 when everything holds.
"""
from __future__ import annotations

import argparse
import json
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def rel(a, b):
    import torch
    a, b = a.double().flatten(1), b.double().flatten(1)
    return float(((a - b).norm(dim=1) / b.norm(dim=1).clamp_min(1e-12)).max())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="deepseek-v4-flash")
    ap.add_argument("--tokens", default="1,7,32,33,256")
    ap.add_argument("--tol", type=float, default=1e-2)
    a = ap.parse_args()
    import torch
    import dsv4_jit
    from dsv4_jit.engines import vllm_mhc as R, vllm_plugin as P
    from dsv4_jit.kernels.mhc import reference as ref
    from dsv4_jit.model_config import load_model_config

    m = load_model_config(a.model)
    tokens = [int(t) for t in a.tokens.split(",")]
    hf = json.loads((Path(dsv4_jit.__file__).parent / "model_configs" / f"{a.model}.json").read_text())
    cfg = types.SimpleNamespace(
        scheduler_config=types.SimpleNamespace(max_num_seqs=min(tokens[-1], 256), max_num_batched_tokens=max(tokens)),
        compilation_config=types.SimpleNamespace(cudagraph_capture_sizes=None, max_cudagraph_capture_size=None,
                                                 cudagraph_mode=None, pass_config=None),
        speculative_config=None, parallel_config=types.SimpleNamespace(tensor_parallel_size=1, data_parallel_size=1),
        model_config=types.SimpleNamespace(enforce_eager=False, model=a.model,
                                           hf_config=types.SimpleNamespace(to_dict=lambda: dict(hf),
                                                                           architectures=["DeepseekV4ForCausalLM"])))
    plan = P.plan_from_vllm_config(cfg)
    rep = dsv4_jit.warm(plan, seal_mode=None)
    print(f"warmup: {plan.compiles} variants, {rep['compiled']} compiled, failures {rep['failures']}")
    dsv4_jit.seal("error")
    before = dsv4_jit.counters()["compiles"]

    dev, g = "cuda", torch.Generator().manual_seed(0)
    hc, h, mix = m.hc_mult, m.hidden_size, m.mix_width
    eps, heps, it, pm = m.rms_norm_eps, m.hc_eps, m.hc_sinkhorn_iters, m.hc_post_mult
    bad = []

    def check(name, t, got, want, shape):
        if tuple(got.shape) != tuple(shape):
            bad.append(f"{name} T={t}: shape {tuple(got.shape)} != vLLM's {tuple(shape)}")
            return
        e = rel(got.reshape(t, -1), want.reshape(t, -1).to(got.device))
        print(f"{name:28} T={t:5}  max rel err {e:.2e}")
        if not e <= a.tol:
            bad.append(f"{name} T={t}: rel err {e:.3e} > {a.tol}")

    def rnd(*s, scale=1.0):
        return (torch.randn(*s, generator=g) * scale)

    for t in tokens:
        res = rnd(t, hc, h).to(torch.bfloat16).to(dev)
        x = rnd(t, h).to(torch.bfloat16).to(dev)
        fn = (rnd(mix, hc * h, scale=4.0 / (hc * h) ** 0.5)).to(dev)
        sc, base = (torch.rand(3, generator=g) + 0.5).to(dev), rnd(mix, scale=0.5).to(dev)
        nw = (torch.rand(h, generator=g) + 0.5).to(torch.bfloat16).to(dev)
        post = torch.rand(t, hc, 1, generator=g).to(dev)
        comb = torch.rand(t, hc, hc, generator=g).to(dev)

        p, c, y = R.route_mhc_pre(res, fn, sc, base, eps, heps, heps, pm, it, norm_weight=nw, norm_eps=eps)
        ry, rp, rc = ref.ref_mhc_pre(res, fn, sc, base, eps, heps, it, pm, norm_weight=nw, norm_eps=eps)
        check("mhc_pre", t, y, ry, (t, h)); check("mhc_pre post", t, p, rp, (t, hc, 1))
        check("mhc_pre comb", t, c, rc, (t, hc, hc))

        fnb = fn.view(mix, hc, h).sum(1)
        r0, p, c, y = R.route_mhc_pre_broadcast(x, fn, sc, base, eps, heps, heps, pm, it, norm_weight=nw,
                                                norm_eps=eps, fn_broadcast=fnb)
        ry, rp, rc = ref.ref_mhc_pre(x, fn, sc, base, eps, heps, it, pm, norm_weight=nw, norm_eps=eps, broadcast=True)
        check("broadcast residual_out", t, r0, x.unsqueeze(1).expand(t, hc, h), (t, hc, h))
        check("broadcast layer_input", t, y, ry, (t, h)); check("broadcast comb", t, c, rc, (t, hc, hc))

        out = R.route_mhc_post(x, res, post, comb)
        check("mhc_post", t, out, ref.ref_mhc_post(x, res, post.squeeze(-1), comb, torch.float64), (t, hc, h))

        rc_, p, c, y = R.route_mhc_fused_post_pre(x, res, post, comb, fn, sc, base, eps, heps, heps, pm, it,
                                                  n_splits=1, tile_n=1, norm_weight=nw, norm_eps=eps)
        rres = ref.ref_mhc_post(x, res, post.squeeze(-1), comb, torch.float32).to(torch.bfloat16)
        ry, rp, rc = ref.ref_mhc_pre(rres, fn, sc, base, eps, heps, it, pm, norm_weight=nw, norm_eps=eps)
        check("fused residual_cur", t, rc_, rres, (t, hc, h)); check("fused layer_input", t, y, ry, (t, h))
        check("fused post", t, p, rp, (t, hc, 1)); check("fused comb", t, c, rc, (t, hc, hc))

        hfn, hsc, hb = rnd(hc, hc * h, scale=4.0 / (hc * h) ** 0.5).to(dev), (torch.rand(1) + 0.5).to(dev), \
            rnd(hc, scale=0.5).to(dev)
        out = R.route_hc_head(res, hfn, hsc, hb, eps, heps)
        check("hc_head", t, out, ref.ref_hc_head(res, hfn, hsc, hb, eps, heps, torch.float64), (t, h))
    torch.cuda.synchronize()
    cnt = dsv4_jit.counters()
    late = cnt["compiles"] - before
    print(f"counters: {json.dumps({k: cnt[k] for k in ('compiles', 'loads', 'sealed_compiles')})}; "
          f"compiles after warmup: {late}; routed {dict(R.ROUTED)}; fallbacks {dict(R.FALLBACKS)}")
    if late or cnt["sealed_compiles"]:
        bad.append(f"{late} compiles after warmup ({cnt['sealed_compiles']} after seal)")
    if R.FALLBACKS:
        bad.append(f"fallbacks to vLLM: {dict(R.FALLBACKS)}")
    for b in bad:
        print("FAIL", b)
    print("OK" if not bad else f"{len(bad)} failure(s)")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
