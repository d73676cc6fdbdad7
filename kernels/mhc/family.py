"""The mHC (manifold-constrained hyper-connection) family: its kernels, call sites and GPU cases.

Kernels: pre.py (prenorm GEMM split-K, big fuse, standalone Sinkhorn), post.py (post, post fused with
the next prenorm GEMM), head.py (hc_head). Host ops: ops.py. References: reference.py.
"""
from __future__ import annotations

import math
from typing import Any

from dsv4_jit.family import GpuCase, KernelFamily, KernelUse, register_family
from dsv4_jit.spec import Variant, get_spec

from . import head, post, pre

# Per-token relative error allowed on the GPU against the float64 reference, every output. bf16
# outputs round at 2^-9 per element; the TF32 prenorm GEMM and rcp.approx Sinkhorn stay near 1e-3.
TOLERANCE = 1e-2


def _uses(model, parallel) -> list[KernelUse]:
    """Every (kernel, static) pair a DeepSeek V4 forward pass launches for mHC.

    mHC runs on the full residual stream, replicated across TP ranks, so TP changes no mHC static."""
    uses: list[KernelUse] = []

    def add(name: str, label: str, **flags: Any) -> None:
        spec = get_spec(name)
        static = dict(spec.static_params(model, parallel))
        static.update(flags)
        uses.append(KernelUse(spec, static, label))

    # hc_pre per block: attention and FFN sub-blocks, each followed by its RMSNorm (fused variant),
    # and the first layer whose residual is one stream broadcast into hc streams.
    add("mhc_pre_norm_fn", "hc_pre gemm (layers)")
    add("mhc_pre_norm_fn", "hc_pre gemm (first layer, broadcast)", broadcast=True)
    add("mhc_pre_fuse", "hc_pre fuse + RMSNorm (layers)", with_norm=True)
    add("mhc_pre_fuse", "hc_pre fuse (no norm)", with_norm=False)
    add("mhc_pre_fuse", "hc_pre fuse + RMSNorm (first layer, broadcast)", with_norm=True, broadcast=True)
    add("mhc_sinkhorn", "hc split + Sinkhorn (standalone)")
    add("mhc_post", "hc_post")
    add("mhc_post_pre_fused", "hc_post fused with next hc_pre gemm")
    add("mhc_head", "hc_head (final + MTP)")
    return uses


def _check_source(variant: Variant, src: str) -> None:
    """Programmatic dependent launch exactly where the params say: norm_fn triggers, the fuse waits."""
    call = {"mhc_pre_norm_fn": "cudaTriggerProgrammaticLaunchCompletion",
            "mhc_pre_fuse": "cudaGridDependencySynchronize"}.get(variant.kernel)
    if call is not None and (call in src) != variant.p["pdl"]:
        raise AssertionError(f"{variant.name}: {call} {'missing' if variant.p['pdl'] else 'emitted'}")
    if variant.kernel in ("mhc_post", "mhc_post_pre_fused", "mhc_head") and "load_global_256" in src:
        raise AssertionError(f"{variant.name}: 256-bit loads (pass config asks for 16-byte vectors)")


# ---------------------------------------------------------------------------------------------
# GPU cases: inputs as a user's would be (token magnitudes spread over e^-2..e^3), float64 references
# ---------------------------------------------------------------------------------------------
def _token_scales(t: int, g) -> Any:
    import torch
    return torch.exp(torch.rand(t, generator=g, dtype=torch.float64) * 5 - 2).float()


def _streams(t: int, hc: int, hidden: int, g, broadcast: bool = False):
    import torch
    scale = _token_scales(t, g)
    if broadcast:
        return (torch.randn(t, hidden, generator=g) * scale[:, None]).to(torch.bfloat16)
    return (torch.randn(t, hc, hidden, generator=g) * scale[:, None, None]).to(torch.bfloat16)


def _hc_weights(m: int, k: int, n_scale: int, g) -> dict:
    import torch
    return {"fn": torch.randn(m, k, generator=g) * (4.0 / math.sqrt(k)),
            "hc_scale": torch.rand(n_scale, generator=g) + 0.5,
            "hc_base": torch.randn(m, generator=g) * 0.5}


def _to(d: dict, device) -> dict:
    return {k: v.to(device) for k, v in d.items()}


def _empty(device, **shapes) -> dict:
    import torch
    return {k: torch.empty(s, dtype=dt, device=device) for k, (s, dt) in shapes.items()}


def _pre_case(m, with_norm: bool, broadcast: bool) -> GpuCase:
    import torch
    from . import ops, reference
    hc, hidden = m.hc_mult, m.hidden_size

    def make_inputs(t, device, g):
        d = {"residual": _streams(t, hc, hidden, g, broadcast), **_hc_weights(m.mix_width, hc * hidden, 3, g)}
        if with_norm:
            d["norm_weight"] = (torch.rand(hidden, generator=g) + 0.5).to(torch.bfloat16)
        return _to(d, device)

    def make_outputs(inp, arch):
        t = inp["residual"].shape[0]
        return _empty(inp["residual"].device, layer_input=((t, hidden), torch.bfloat16),
                      post=((t, hc), torch.float32), comb=((t, hc, hc), torch.float32))

    def launch(inp, out, arch, get_kernel):
        ops.mhc_pre(inp["residual"], inp["fn"], inp["hc_scale"], inp["hc_base"], norm_weight=inp.get("norm_weight"),
                    rms_eps=m.rms_norm_eps, hc_eps=m.hc_eps, sinkhorn_iters=m.hc_sinkhorn_iters,
                    post_mult=m.hc_post_mult, arch=arch, get_kernel=get_kernel,
                    out=(out["layer_input"], out["post"], out["comb"]))

    def ref(inp, out):
        y, p, c = reference.ref_mhc_pre(inp["residual"], inp["fn"], inp["hc_scale"], inp["hc_base"], m.rms_norm_eps,
                                        m.hc_eps, m.hc_sinkhorn_iters, m.hc_post_mult,
                                        norm_weight=inp.get("norm_weight"), broadcast=broadcast)
        return {"layer_input": y, "post": p, "comb": c}

    flags = ",".join(n for n, on in (("norm", with_norm), ("broadcast", broadcast)) if on) or "plain"
    # No forward pass calls the broadcast fuse without its RMSNorm (see _uses): the op supports it and is
    # checked, but the planner does not warm it.
    return GpuCase(f"mhc_pre[{flags}]", make_inputs, make_outputs, launch, ref,
                   {"layer_input": TOLERANCE, "post": TOLERANCE, "comb": TOLERANCE},
                   planned=with_norm or not broadcast, fixes={"broadcast": broadcast, "with_norm": with_norm})


def _sinkhorn_case(m) -> GpuCase:
    import torch
    from . import ops, reference
    hc = m.hc_mult

    def make_inputs(t, device, g):
        w = _hc_weights(m.mix_width, 1, 3, g)
        return _to({"mixes": torch.randn(t, m.mix_width, generator=g) * 2, "hc_scale": w["hc_scale"],
                    "hc_base": w["hc_base"]}, device)

    def make_outputs(inp, arch):
        t = inp["mixes"].shape[0]
        f32 = torch.float32
        return _empty(inp["mixes"].device, pre=((t, hc), f32), post=((t, hc), f32), comb=((t, hc, hc), f32))

    def launch(inp, out, arch, get_kernel):
        ops.mhc_sinkhorn(inp["mixes"], inp["hc_scale"], inp["hc_base"], hc_eps=m.hc_eps,
                         sinkhorn_iters=m.hc_sinkhorn_iters, post_mult=m.hc_post_mult, arch=arch,
                         get_kernel=get_kernel, out=(out["pre"], out["post"], out["comb"]))

    def ref(inp, out):
        p, q, c = reference.ref_sinkhorn(inp["mixes"], inp["hc_scale"], inp["hc_base"], m.hc_eps,
                                         m.hc_sinkhorn_iters, m.hc_post_mult)
        return {"pre": p, "post": q, "comb": c}

    return GpuCase("mhc_sinkhorn", make_inputs, make_outputs, launch, ref,
                   {"pre": TOLERANCE, "post": TOLERANCE, "comb": TOLERANCE})


def _post_inputs(m, t: int, device, g, with_fn: bool) -> dict:
    import torch
    hc, hidden = m.hc_mult, m.hidden_size
    comb = torch.rand(t, hc, hc, generator=g)
    d = {"x": _streams(t, 1, hidden, g, broadcast=True), "residual": _streams(t, hc, hidden, g),
         "post": 2 * torch.rand(t, hc, generator=g), "comb": comb / comb.sum(1, keepdim=True)}
    if with_fn:
        d["fn_next"] = torch.randn(m.mix_width, hc * hidden, generator=g) * (hc * hidden) ** -0.5
    return _to(d, device)


def _post_case(m) -> GpuCase:
    import torch
    from . import ops, reference
    hc, hidden = m.hc_mult, m.hidden_size

    def make_outputs(inp, arch):
        return _empty(inp["x"].device, out=((inp["x"].shape[0], hc, hidden), torch.bfloat16))

    def launch(inp, out, arch, get_kernel):
        ops.mhc_post(inp["x"], inp["residual"], inp["post"], inp["comb"], arch=arch, get_kernel=get_kernel,
                     out=out["out"])

    def ref(inp, out):
        return {"out": reference.ref_mhc_post(inp["x"], inp["residual"], inp["post"], inp["comb"], torch.float64)}

    return GpuCase("mhc_post", lambda t, d, g: _post_inputs(m, t, d, g, False), make_outputs, launch, ref,
                   {"out": TOLERANCE})


def _post_pre_fused_case(m) -> GpuCase:
    import torch
    from . import ops, reference
    hc, hidden = m.hc_mult, m.hidden_size
    spec = get_spec("mhc_post_pre_fused")

    def make_outputs(inp, arch):
        t = inp["x"].shape[0]
        v = spec.select(arch, {"hidden_size": hidden, "hc_mult": hc, "mix_width": m.mix_width}, t)
        s, pad = post.fused_num_splits(v), v.p["mix_pad"]
        return _empty(inp["x"].device, out=((t, hc, hidden), torch.bfloat16), mix_part=((s, t, pad), torch.float32),
                      sq_part=((s, t), torch.float32))

    def launch(inp, out, arch, get_kernel):
        ops.mhc_post_pre_fused(inp["x"], inp["residual"], inp["post"], inp["comb"], inp["fn_next"], arch=arch,
                               get_kernel=get_kernel, out=out["out"], mix_part=out["mix_part"],
                               sq_part=out["sq_part"])

    def ref(inp, out):
        s, _, pad = out["mix_part"].shape
        o, mp_, sq = reference.ref_mhc_post_pre_fused(inp["x"], inp["residual"], inp["post"], inp["comb"],
                                                      inp["fn_next"], s, pad, torch.float64)
        return {"out": o, "mix_part": mp_, "sq_part": sq}

    return GpuCase("mhc_post_pre_fused", lambda t, d, g: _post_inputs(m, t, d, g, True), make_outputs, launch, ref,
                   {"out": TOLERANCE, "mix_part": TOLERANCE, "sq_part": TOLERANCE},
                   token_dims={"mix_part": 1, "sq_part": 1})


def _head_case(m) -> GpuCase:
    import torch
    from . import ops, reference
    hc, hidden = m.hc_mult, m.hidden_size

    def make_inputs(t, device, g):
        return _to({"residual": _streams(t, hc, hidden, g), **_hc_weights(hc, hc * hidden, 1, g)}, device)

    def make_outputs(inp, arch):
        return _empty(inp["residual"].device, out=((inp["residual"].shape[0], hidden), torch.bfloat16))

    def launch(inp, out, arch, get_kernel):
        ops.hc_head(inp["residual"], inp["fn"], inp["hc_scale"], inp["hc_base"], rms_eps=m.rms_norm_eps,
                    hc_eps=m.hc_eps, arch=arch, get_kernel=get_kernel, out=out["out"])

    def ref(inp, out):
        return {"out": reference.ref_hc_head(inp["residual"], inp["fn"], inp["hc_scale"], inp["hc_base"],
                                             m.rms_norm_eps, m.hc_eps, torch.float64)}

    return GpuCase("hc_head", make_inputs, make_outputs, launch, ref, {"out": TOLERANCE}, op="mhc_head")


def _gpu_cases(m) -> list[GpuCase]:
    return [*(_pre_case(m, n, b) for n in (False, True) for b in (False, True)), _sinkhorn_case(m), _post_case(m),
            _post_pre_fused_case(m), _head_case(m)]


FAMILY = register_family(KernelFamily(
    name="mhc",
    specs=(get_spec("mhc_pre_norm_fn"), get_spec("mhc_pre_fuse"), get_spec("mhc_sinkhorn"), get_spec("mhc_post"),
           get_spec("mhc_post_pre_fused"), get_spec("mhc_head")),
    uses=_uses,
    gpu_cases=_gpu_cases,
    ops={"mhc_pre": ("mhc_pre_norm_fn", "mhc_pre_fuse"), "mhc_sinkhorn": ("mhc_sinkhorn",),
         "mhc_post": ("mhc_post",), "mhc_post_pre_fused": ("mhc_post_pre_fused",), "mhc_head": ("mhc_head",)},
    check_source=_check_source,
    doc="mHC hyper-connections: hc_pre (prenorm GEMM + big fuse), Sinkhorn, hc_post, fused post+pre, hc_head",
))

__all__ = ["FAMILY", "pre", "post", "head"]
