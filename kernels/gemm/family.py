"""The FP8 block-scaled GEMM family: every FP8 linear of a DeepSeek V4 layer (fp8_gemm.py), split-K
partials summed in the same launch or (64-row tiles) by fp8_gemm_reduce. Host op: ops.py. Reference: reference.py.

Which GEMMs a forward pass runs per layer (dsv4_kernels.md section 1 table; shapes as K -> N, derived from the
model config by `gemm_shapes`, never typed in). Assumptions (stated, not read from an engine):
  * wq_a and wkv are fused into one GEMM (vLLM `fused_wqa_wkv`, N = q_lora_rank + head_dim) and replicated
    on every TP rank (no TP split, as vLLM's fused q_a/kv_a projections).
  * wq_b is column-parallel: N = heads / TP * head_dim.
  * wo_a (grouped low-rank output projection) runs at FP8 as one grouped GEMM of o_groups / TP groups per rank,
    each K = heads / o_groups * head_dim -> N = o_lora_rank (vLLM's fp8_einsum; the reference uses a bf16
    einsum). wo_b is row-parallel: K = o_groups / TP * o_lora_rank -> N = hidden.
  * The indexer's wq_b (q_lora_rank -> index_n_heads * index_head_dim) is replicated (vLLM ReplicatedLinear; the
    indexer family states the same), and only layers with compress ratio 4 run it.
  * The shared expert(s) run at FP8: w1 and w3 fused (N = 2 * n_shared * moe_intermediate / TP, column-parallel),
    w2 row-parallel (K = n_shared * moe_intermediate / TP -> N = hidden). Routed experts are MXFP4 (another
    family); gate, compressor, indexer weights_proj and the LM head are not FP8 GEMMs.
  * MTP layers run the same attention / shared-expert shapes (their own projections, if FP8, are not listed).
"""
from __future__ import annotations

from dsv4_jit.family import GpuCase, KernelFamily, KernelUse, register_family
from dsv4_jit.spec import get_spec
from dsv4_jit.testing import cuda_generator

from . import fp8_gemm  # noqa: F401  (registers the specs)

# bf16 output (2^-9 relative per element) of an fp32 sum of exact fp8 products: ~2e-3 per token expected.
TOLERANCE = 1e-2
GPU_TOKENS = (1, 7, 8, 9, 31, 33, 64, 200, 300, 2049)   # both sides of the 8 / 16 / 32 / 64 / 256 schedule boundaries


def _div(what: str, a: int, b: int) -> int:
    if b < 1 or a % b:
        raise ValueError(f"{what}={a} is not divisible by tensor-parallel size {b}")
    return a // b


def gemm_shapes(model, tp: int = 1) -> list[dict]:
    """Every FP8 GEMM shape a forward pass runs per rank at this TP: dicts with label, n, k, groups (the GEMM
    computes C [M, groups * n] from K = groups * k), in layer order, duplicates merged (labels joined)."""
    h, hd = int(model.hidden_size), int(model.head_dim)
    heads = int(model.num_attention_heads)
    inter = int(model.moe_intermediate_size) * int(model.n_shared_experts)
    rows = [
        ("wq_a+wkv (fused, replicated)", int(model.q_lora_rank) + hd, h, 1),
        ("wq_b (column-parallel)", _div("num_attention_heads", heads, tp) * hd, int(model.q_lora_rank), 1),
        ("wo_a (grouped, o_groups/TP groups)", int(model.o_lora_rank), (heads // int(model.o_groups)) * hd,
         _div("o_groups", int(model.o_groups), tp)),
        ("wo_b (row-parallel)", h, _div("o_groups", int(model.o_groups), tp) * int(model.o_lora_rank), 1),
    ]
    if 4 in model.layer_ratios:
        rows.append(("indexer wq_b (replicated, ratio-4 layers)", int(model.index_n_heads) * int(model.index_head_dim),
                     int(model.q_lora_rank), 1))
    if inter:
        rows += [("shared expert w1+w3 (fused, column-parallel)", 2 * _div("moe_intermediate_size", inter, tp), h, 1),
                 ("shared expert w2 (row-parallel)", h, _div("moe_intermediate_size", inter, tp), 1)]
    out: dict[tuple, dict] = {}
    for label, n, k, g in rows:
        key = (n, k, g)
        if key in out:
            out[key]["label"] += " / " + label
        else:
            out[key] = {"label": label, "n": n, "k": k, "groups": g}
    return list(out.values())


def _uses(model, parallel) -> list[KernelUse]:
    from .ops import gemm_static
    spec = get_spec("fp8_gemm")
    uses = [KernelUse(spec, gemm_static(s["n"], s["k"], s["groups"]),
                      f"fp8 GEMM {s['label']}: K {s['groups'] * s['k']} -> N {s['groups'] * s['n']}")
            for s in gemm_shapes(model, parallel.tp_size)]
    uses.append(KernelUse(get_spec("fp8_gemm_reduce"), {}, "split-K reduction of the 64-row-tile fp8 GEMMs"))
    return uses


# ---------------------------------------------------------------------------------------------
# GPU cases
# ---------------------------------------------------------------------------------------------
def make_activations(t: int, width: int, cg, device):
    """bf16 activations as a layer's would be: per-token magnitudes over e^-2..e^3 and a few outlier channels
    (x8), quantized 1x128 with UE8M0 scales by the torch reference."""
    import torch
    from dsv4_jit.kernels.quant.reference import ref_act_quant_fp8
    mag = torch.exp(torch.rand(t, 1, generator=cg, device=device) * 5 - 2)
    x = torch.randn(t, width, generator=cg, device=device) * mag
    x[:, ::97] *= 8
    return ref_act_quant_fp8(x.to(torch.bfloat16))


def make_weights(groups: int, n: int, k: int, cg, device):
    """fp8 weights [groups * n, k] with per-128x128-block magnitudes over e^-1..e^1 and stacked UE8M0 block
    scales [groups * ceil(n / 128), k / 128]."""
    import torch
    from .reference import quantize_weight_blocks
    qs, ss = [], []
    for _ in range(groups):
        w = torch.randn(n, k, generator=cg, device=device) * 0.02
        blk = torch.exp(torch.rand(-(-n // 128), k // 128, generator=cg, device=device) * 2 - 1)
        w *= blk.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)
        q, s = quantize_weight_blocks(w)
        qs.append(q)
        ss.append(s)
    return torch.cat(qs), torch.cat(ss)


def _case(m, shape: dict, tp: int) -> GpuCase:
    import torch
    from . import ops, reference
    n, k, groups = shape["n"], shape["k"], shape["groups"]

    def make_inputs(t, device, g):
        cg = cuda_generator(g, device)
        a, sa = make_activations(t, groups * k, cg, device)
        b, sb = make_weights(groups, n, k, cg, device)
        return {"a": a, "sa": sa, "b": b, "sb": sb}

    def make_outputs(inp, arch):
        return {"c": torch.empty(inp["a"].shape[0], groups * n, dtype=torch.float64, device=inp["a"].device)}

    def launch(inp, out, arch, get_kernel):
        t = inp["a"].shape[0]
        c = torch.full((t, groups * n), float("nan"), dtype=torch.bfloat16, device=inp["a"].device)
        ws = torch.full((max(1, ops.fp8_gemm_workspace_numel(n, k, t, arch=arch, groups=groups)),), float("nan"),
                        dtype=torch.float32, device=inp["a"].device)
        # NaN everywhere, counters included: the op zeroes them on the workspace's first use
        ops.fp8_gemm(inp["a"], inp["sa"], inp["b"], inp["sb"], arch=arch, get_kernel=get_kernel, groups=groups,
                     out=c, workspace=ws)
        if ws.numel() > 1 and ws[:ops.FIXUP_COUNTERS].view(torch.int32).any():
            raise AssertionError("fp8_gemm: a split-K launch left an arrival counter nonzero")
        out["c"].copy_(c.double())

    def ref(inp, out):
        return {"c": reference.ref_fp8_gemm(inp["a"], inp["sa"], inp["b"], inp["sb"], groups)}

    name = f"fp8_gemm[{shape['label']}, TP{tp}: K {groups * k} -> N {groups * n}]"
    return GpuCase(name, make_inputs, make_outputs, launch, ref, {"c": TOLERANCE}, tokens=GPU_TOKENS, tp_size=tp,
                   fixes={"n": n, "k": k, "groups": groups})


def _pick(shapes: list[dict], *prefixes: str) -> list[dict]:
    return [s for s in shapes if s["label"].startswith(prefixes)]


def _gpu_cases(m) -> list[GpuCase]:
    """A representative subset: at TP 1 the fused q_a/kv_a, wo_a (grouped) and wo_b (split-K at small M); at
    TP 8 wq_b, the shared expert's w1+w3 and w2 (K = 256 / 384: one or three K blocks) and wo_a (1 / 2 groups)."""
    cases = [_case(m, s, 1) for s in _pick(gemm_shapes(m, 1), "wq_a", "wo_a", "wo_b")]
    cases += [_case(m, s, 8) for s in _pick(gemm_shapes(m, 8), "wq_b", "shared", "wo_a")]
    return cases


FAMILY = register_family(KernelFamily(
    name="gemm",
    specs=(get_spec("fp8_gemm"), get_spec("fp8_gemm_reduce")),
    uses=_uses,
    gpu_cases=_gpu_cases,
    ops={"fp8_gemm": ("fp8_gemm", "fp8_gemm_reduce")},
    # decode tiles of 16 / 32 / 64 rows (and two 32-row tiles at 33..64), batched decode, up to 4 large-M forms
    max_variants_per_use=10,
    doc="FP8 block-scaled GEMM (1x128 activation / 128x128 weight UE8M0 scales), decode split-K + large-M",
))

__all__ = ["FAMILY", "fp8_gemm", "gemm_shapes"]
