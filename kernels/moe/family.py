"""The routed-expert (MoE) family: the MXFP4 grouped expert GEMM (fp4_moe_gemm.py) over the routed-row layout
built by ops.moe_align. Host ops: ops.py. Reference: reference.py.

Call sites per forward pass (shapes derived from the model config, assumptions stated):
  * every MoE layer runs two grouped GEMMs over its routed rows: w1 and w3 fused (K = hidden -> N = 2 x
    moe_intermediate / TP) and w2 (K = moe_intermediate / TP -> N = hidden), between them swiglu_quant_fp8 (the
    quant family). TP shards each expert's intermediate dimension (vLLM's default without expert parallelism);
    with expert parallelism every rank holds whole experts, the TP 1 shapes, which a plan for TP 1 covers.
  * The activations enter as act_quant_fp8 rows (quant family) gathered into the layout; moe_combine sums each
    token's top-k rows of w2's output with the routing weights.
  * moe_route runs once per MoE layer after the gate GEMM (fp32 logits [T, E]): the scored form on most layers,
    the hashed form (experts from tid2eid[input_ids]) on V4's first, hash-routed layers; both are planned.
"""
from __future__ import annotations

from dsv4_jit.family import GpuCase, KernelFamily, KernelUse, register_family
from dsv4_jit.spec import get_spec
from dsv4_jit.testing import cuda_generator

from . import combine, fp4_moe_gemm, route  # noqa: F401  (registers the specs)

# bf16 output of fp32 sums of exact fp8 x e2m1 products: ~2e-3 per row expected, as fp8_gemm.
TOLERANCE = 1e-2
GPU_TOKENS = (1, 7, 64, 256, 257, 513, 2049)   # both sides of the 256 / 512 / 2048 block_m boundaries
GPU_EXPERTS = 8                         # the expert count is runtime: 8 keep inputs and the float64 reference small


def _div(what: str, a: int, b: int) -> int:
    if b < 1 or a % b:
        raise ValueError(f"{what}={a} is not divisible by tensor-parallel size {b}")
    return a // b


def moe_shapes(model, tp: int = 1) -> list[dict]:
    """The routed experts' GEMM shapes per rank at this TP: dicts with label, n, k."""
    h = int(model.hidden_size)
    inter = _div("moe_intermediate_size", int(model.moe_intermediate_size), tp)
    return [{"label": "routed experts w1+w3 (fused)", "n": 2 * inter, "k": h},
            {"label": "routed experts w2", "n": h, "k": inter}]


def _uses(model, parallel) -> list[KernelUse]:
    from .ops import moe_static, route_static
    spec = get_spec("fp4_moe_gemm")
    uses = [KernelUse(spec, moe_static(s["n"], s["k"]), f"MXFP4 grouped GEMM {s['label']}: K {s['k']} -> N {s['n']}")
            for s in moe_shapes(model, parallel.tp_size)]
    e, k = int(model.n_routed_experts), int(model.num_experts_per_tok)
    uses += [KernelUse(get_spec("moe_route"), route_static(e, k, False), f"routing: sqrtsoftplus + bias top-{k} of {e}"),
             KernelUse(get_spec("moe_route"), route_static(e, k, True), f"routing, hash-routed layers: top-{k} given"),
             KernelUse(get_spec("moe_combine"), {"topk": k}, f"weighted combine of the top-{k} expert rows")]
    return uses


def _combine_case(m) -> GpuCase:
    import torch
    from . import ops, reference
    e, k, n = 16, int(m.num_experts_per_tok), int(m.hidden_size)

    def make_inputs(t, device, g):
        ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).int()
        rows, _ = ops.moe_align(ids, e, 16)
        c = (torch.randn(rows.numel(), n, generator=g) * torch.exp(torch.rand(rows.numel(), 1, generator=g) * 4 - 2))
        w = torch.rand(t, k, generator=g) + 0.1
        return {"c": c.to(torch.bfloat16).to(device), "rows": rows.to(device), "w": (w / w.sum(1, keepdim=True)).to(device)}

    def make_outputs(inp, arch):
        return {"out": torch.empty(inp["w"].shape[0], n, dtype=torch.float64, device=inp["c"].device)}

    def launch(inp, out, arch, get_kernel):
        t = inp["w"].shape[0]
        o = torch.full((t, n), float("nan"), dtype=torch.bfloat16, device=inp["c"].device)
        ops.moe_combine(inp["c"], ops.moe_entry_rows(inp["rows"], t * k), inp["w"], arch=arch, get_kernel=get_kernel,
                        out=o)
        out["out"].copy_(o.double())

    def ref(inp, out):
        t = inp["w"].shape[0]
        inv = reference.ref_moe_entry_rows(inp["rows"].cpu(), t * k).to(inp["c"].device)
        return {"out": reference.ref_moe_combine(inp["c"], inv, inp["w"])}

    return GpuCase("moe_combine", make_inputs, make_outputs, launch, ref, {"out": 1e-2}, tokens=(1, 7, 64, 300, 2049))


ROUTE_SCALE = 1.5     # V4-Flash's routed_scaling_factor; the kernel does not depend on it


def _route_case(m, hashed: bool) -> GpuCase:
    import torch
    from . import ops, reference
    e, k = int(m.n_routed_experts), int(m.num_experts_per_tok)

    def make_inputs(t, device, g):
        logits = torch.randn(t, e, generator=g) * 2
        logits[:, :3] = logits[:, 3:4]                       # exact ties: the lower index must win
        inp = {"logits": logits.to(device), "t": t}
        if hashed:
            inp["hash_ids"] = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).int().to(device)
        else:
            bias = torch.randn(e, generator=g) * 0.1
            bias[:4] = bias[0]                                # with the equal logits: exact ties in s + bias
            inp["bias"] = bias.to(device)
        return inp

    def make_outputs(inp, arch):
        dev = inp["logits"].device
        return {"ids": torch.empty(inp["t"], k, dtype=torch.float64, device=dev),
                "weights": torch.empty(inp["t"], k, dtype=torch.float64, device=dev)}

    def launch(inp, out, arch, get_kernel):
        ids, w = ops.moe_route(inp["logits"], topk=k, routed_scaling=ROUTE_SCALE, bias=inp.get("bias"),
                               hash_ids=inp.get("hash_ids"), arch=arch, get_kernel=get_kernel)
        out["ids"].copy_(ids.double())
        out["weights"].copy_(w.double())

    def ref(inp, out):
        want_ids, _ = reference.ref_moe_route(inp["logits"], inp.get("bias"), inp.get("hash_ids"), k, ROUTE_SCALE)
        if not hashed:
            # GPU exp/log may differ from torch's by an ulp: where the kernel's picks are a valid top-k of the
            # float64 scores within 1e-5 (and exact ties went to the lower index), expect exactly its picks
            got = out["ids"].long()
            sel = reference.route_scores(inp["logits"], torch.float64) + inp["bias"].double()
            picked = sel.gather(1, got.clamp(0, e - 1))
            rest = sel.scatter(1, got.clamp(0, e - 1), float("-inf"))
            ok = picked.min(dim=1).values >= rest.max(dim=1).values - 1e-5
            ok &= (picked[:, :-1] >= picked[:, 1:] - 1e-5).all(dim=1)
            ok &= (got.sort(dim=1).values.diff(dim=1) != 0).all(dim=1)           # k distinct experts
            top = sel.sort(dim=1, descending=True).values[:, :k + 1]
            ok &= ~(top.diff(dim=1) == 0).any(dim=1)   # exact ties: the strict rule (lower index first) applies
            want_ids = torch.where(ok[:, None], got, want_ids)
        _, w = reference.ref_moe_route(inp["logits"], None, want_ids.int(), k, ROUTE_SCALE)
        return {"ids": want_ids.double(), "weights": w}

    return GpuCase(f"moe_route[{'hashed' if hashed else 'scored'}, top-{k} of {e}]", make_inputs, make_outputs, launch,
                   ref, {"ids": 0.0, "weights": 1e-5}, tokens=(1, 7, 64, 300, 2049), fixes={"hashed": hashed})


def _case(m, shape: dict, tp: int) -> GpuCase:
    import torch
    from dsv4_jit.kernels.gemm.family import make_activations
    from . import ops, reference
    n, k = shape["n"], shape["k"]
    topk = min(int(m.num_experts_per_tok), GPU_EXPERTS - 1)   # ids are drawn from the first GPU_EXPERTS - 1

    def make_inputs(t, device, g):
        cg = cuda_generator(g, device)
        # distinct experts per token; the last expert gets no rows
        ids = torch.rand(t, GPU_EXPERTS - 1, generator=cg, device=device).argsort(dim=1)[:, :topk].int()
        x, sx = make_activations(t, k, cg, device)
        # one expert at a time (V4-Pro's w1+w3 is 6144 x 7168): per-32-group magnitudes over e^-2..e^2
        parts = []
        for _ in range(GPU_EXPERTS):
            wf = torch.randn(1, n, k, generator=cg, device=device) * 0.02
            wf *= torch.exp(torch.rand(1, n, k // 32, generator=cg, device=device) * 4 - 2).repeat_interleave(32, 2)
            parts.append(reference.quantize_expert_weights(wf))
            del wf
        w, sw = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        return {"x": x, "sx": sx, "ids": ids, "w": w, "sw": sw, "t": t}

    def make_outputs(inp, arch):
        # the routed-row layout, built once per token count: launched, then checked against the plain loop
        bm = ops.fp4_moe_block_m(n, k, inp["t"], arch=arch)
        rows, blocks = ops.moe_align(inp["ids"], GPU_EXPERTS, bm)
        src = (rows.clamp(min=0) // topk).long()
        inp["_layout"] = (bm, rows, blocks, inp["x"][src].contiguous(), inp["sx"][src].contiguous())
        return {"c": torch.empty(rows.numel(), n, dtype=torch.float64, device=rows.device)}

    def launch(inp, out, arch, get_kernel):
        _, rows, blocks, a, sa = inp["_layout"]
        c = torch.full((a.shape[0], n), float("nan"), dtype=torch.bfloat16, device=a.device)
        ops.fp4_moe_gemm(a, sa, inp["w"], inp["sw"], blocks, num_tokens=inp["t"], arch=arch, get_kernel=get_kernel,
                         out=c)
        out["c"].copy_(c.double())

    def ref(inp, out):
        bm, rows, blocks, a, sa = inp["_layout"]
        # the GPU layout itself against the plain loop (a wrong row -> token map would pass the GEMM check)
        want_rows, want_blocks = reference.ref_moe_align(inp["ids"].cpu(), GPU_EXPERTS, bm, rows.numel())
        if not (torch.equal(rows.cpu().long(), want_rows) and torch.equal(blocks.cpu().long(), want_blocks)):
            raise AssertionError(f"moe_align on {rows.device} differs from the reference layout at T={inp['t']}")
        return {"c": reference.ref_fp4_moe_gemm(a, sa, inp["w"], inp["sw"], blocks, bm)}

    name = f"fp4_moe_gemm[{shape['label']}, TP{tp}: K {k} -> N {n}]"
    return GpuCase(name, make_inputs, make_outputs, launch, ref, {"c": TOLERANCE}, tokens=GPU_TOKENS, tp_size=tp,
                   fixes={"n": n, "k": k})


def _gpu_cases(m) -> list[GpuCase]:
    """w1+w3 and w2 at TP 1 (K = hidden / full intermediate) and at TP 8 (w1+w3: V4-Pro's narrow 32-column tiles at
    a few tokens; w2: K = 256 / 384, 2-3 K blocks)."""
    cases = [_case(m, s, 1) for s in moe_shapes(m, 1)]
    cases += [_case(m, s, 8) for s in moe_shapes(m, 8)]
    return cases + [_route_case(m, False), _route_case(m, True), _combine_case(m)]


FAMILY = register_family(KernelFamily(
    name="moe",
    specs=(get_spec("fp4_moe_gemm"), get_spec("moe_route"), get_spec("moe_combine")),
    uses=_uses,
    gpu_cases=_gpu_cases,
    ops={"fp4_moe_gemm": ("fp4_moe_gemm",), "moe_route": ("moe_route",), "moe_combine": ("moe_combine",)},
    doc="V4 routing (sqrtsoftplus + bias top-k, hash layers), MXFP4 grouped expert GEMM, routed-row layout, combine",
))

__all__ = ["FAMILY", "moe_shapes"]
