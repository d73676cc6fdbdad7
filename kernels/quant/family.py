"""The activation-quantization family (act_quant.py): 1x128 e4m3 before every FP8 GEMM, the 1x64 in-place KV
NoPE quant-dequant, the indexer's 1x32 e2m1, and the expert SwiGLU fused with w2's input quantization. Host ops:
ops.py. References: reference.py.

Call sites per forward pass (assumptions stated, not read from an engine):
  * act_quant_fp8 runs on the input of every FP8 GEMM (kernels/gemm/family.py lists them): the hidden state
    (fused wq_a+wkv, shared expert w1+w3, and the routed MXFP4 experts' activations), the q LoRA latent (wq_b,
    indexer wq_b), the attention output (wo_a: heads / TP * head_dim; group boundaries of 128 never straddle a
    wo_a group) and the wo_a output (wo_b: o_groups / TP * o_lora_rank).
  * swiglu_quant_fp8 runs before w2: routed experts with the clamp (swiglu_limit; intermediate / TP per rank),
    the shared expert without it (the reference builds the shared expert with swiglu_limit 0).
  * act_quant_fp8_inplace runs on the KV NoPE dims (head_dim - rope dims = 448 of 512) of the new KV rows and of
    the compressed KV, as the reference's QAT simulation does.
  * act_quant_fp4 runs on the (Hadamard-rotated) indexer q and compressed index K rows of ratio-4 layers.
"""
from __future__ import annotations

from dsv4_jit.family import GpuCase, KernelFamily, KernelUse, register_family
from dsv4_jit.spec import get_spec
from dsv4_jit.testing import cuda_generator

from . import act_quant  # noqa: F401  (registers the specs)

GPU_TOKENS = (1, 7, 64, 300, 2049)
EXACT_TOL = 1e-3     # vs the torch transcription of the same rounding (bit-exact expected)
# vs the float64 input (the rounding itself), measured with the references on these inputs at 7 / 300 / 2049
# tokens: e4m3 worst token 3.2e-2 (act_quant), 4.2e-2 (in-place KV rows), 4.8e-2 (SwiGLU: many near-zero
# values in low binades); e2m1 worst token 0.25 (outlier channels leave the rest of their group near zero)
FP8_TOL = 8e-2
FP4_TOL = 0.4
SWIGLU_TOL = 2e-2    # vs the torch transcription: fp32 exp on the GPU may round a few bf16 values differently


def _div(what: str, a: int, b: int) -> int:
    if b < 1 or a % b:
        raise ValueError(f"{what}={a} is not divisible by tensor-parallel size {b}")
    return a // b


def quant_statics(model, tp: int = 1) -> list[tuple[str, dict, str]]:
    """(kernel, static, label) of every quantization call site per rank at this TP, duplicates merged."""
    heads = _div("num_attention_heads", int(model.num_attention_heads), tp)
    og = _div("o_groups", int(model.o_groups), tp)
    rows = [("act_quant_fp8", {"n": int(model.hidden_size)}, "hidden state (wq_a+wkv, shared and routed experts)"),
            ("act_quant_fp8", {"n": int(model.q_lora_rank)}, "q LoRA latent (wq_b, indexer wq_b)"),
            ("act_quant_fp8", {"n": heads * int(model.head_dim)}, "attention output (wo_a)"),
            ("act_quant_fp8", {"n": og * int(model.o_lora_rank)}, "wo_a output (wo_b)"),
            ("swiglu_quant_fp8", {"n": _div("moe_intermediate_size", int(model.moe_intermediate_size), tp),
                                  "limit": float(model.swiglu_limit)}, "routed experts SwiGLU (clamped) + quant"),
            ("act_quant_fp8_inplace", {"n": int(model.nope_head_dim), "stride": int(model.head_dim)},
             "KV NoPE 1x64 quant-dequant (new and compressed KV)")]
    if int(model.n_shared_experts):
        inter = _div("moe_intermediate_size", int(model.moe_intermediate_size) * int(model.n_shared_experts), tp)
        rows.append(("swiglu_quant_fp8", {"n": inter, "limit": 0.0}, "shared expert SwiGLU + quant"))
    if 4 in model.layer_ratios:
        rows.append(("act_quant_fp4", {"n": int(model.index_head_dim)}, "indexer q / compressed K e2m1 (ratio-4 layers)"))
    out: dict[tuple, list] = {}
    for name, static, label in rows:
        key = (name, tuple(sorted(static.items())))
        if key in out:
            out[key][2] += " / " + label
        else:
            out[key] = [name, static, label]
    return [tuple(v) for v in out.values()]


def _uses(model, parallel) -> list[KernelUse]:
    return [KernelUse(get_spec(name), static, label) for name, static, label in quant_statics(model, parallel.tp_size)]


# ---------------------------------------------------------------------------------------------
# GPU cases
# ---------------------------------------------------------------------------------------------
def _x(t: int, width: int, g, device, spread=(-2.0, 3.0)):
    """bf16 rows with per-token magnitudes over e^spread, outlier channels (x8) and one all-zero row (the amax
    floor)."""
    import torch
    cg = cuda_generator(g, device)
    lo, hi = spread
    mag = torch.exp(torch.rand(t, 1, generator=cg, device=device) * (hi - lo) + lo)
    x = torch.randn(t, width, generator=cg, device=device) * mag
    x[:, ::97] *= 8
    if t > 3:
        x[t // 2] = 0
    return x.to(torch.bfloat16)


def _fp8_case(m, n: int) -> GpuCase:
    import torch
    from . import ops, reference

    def make_outputs(inp, arch):
        t, dev = inp["x"].shape[0], inp["x"].device
        return {"y": torch.empty(t, n, dtype=torch.float64, device=dev),
                "y_exact": torch.empty(t, n, dtype=torch.float64, device=dev),
                "scales": torch.empty(t, n // 128, dtype=torch.float64, device=dev)}

    def launch(inp, out, arch, get_kernel):
        t, dev = inp["x"].shape[0], inp["x"].device
        y = torch.zeros(t, n, dtype=torch.float8_e4m3fn, device=dev)
        s = torch.full((t, n // 128), float("nan"), dtype=torch.float32, device=dev)
        ops.act_quant_fp8(inp["x"], arch=arch, get_kernel=get_kernel, out=y, scales=s)
        deq = reference.dequant_fp8(y, s)
        out["y"].copy_(deq)
        out["y_exact"].copy_(deq)
        out["scales"].copy_(s.double())

    def ref(inp, out):
        y, s = reference.ref_act_quant_fp8(inp["x"])
        return {"y": inp["x"].double(), "y_exact": reference.dequant_fp8(y, s), "scales": s.double()}

    return GpuCase(f"act_quant_fp8[n={n}]", lambda t, d, g: {"x": _x(t, n, g, d)}, make_outputs, launch, ref,
                   {"y": FP8_TOL, "y_exact": EXACT_TOL, "scales": 0.0}, tokens=GPU_TOKENS, fixes={"n": n})


def _inplace_case(m) -> GpuCase:
    import torch
    from . import ops, reference
    n, stride = int(m.nope_head_dim), int(m.head_dim)

    def make_outputs(inp, arch):
        t, dev = inp["x"].shape[0], inp["x"].device
        return {"x": torch.empty(t, stride, dtype=torch.float64, device=dev),
                "x_vs_input": torch.empty(t, stride, dtype=torch.float64, device=dev)}

    def launch(inp, out, arch, get_kernel):
        x = inp["x"].clone()
        ops.act_quant_fp8_inplace(x, n=n, arch=arch, get_kernel=get_kernel)
        out["x"].copy_(x.double())
        out["x_vs_input"].copy_(x.double())

    def ref(inp, out):
        return {"x": reference.ref_act_quant_fp8_inplace(inp["x"], n).double(), "x_vs_input": inp["x"].double()}

    return GpuCase(f"act_quant_fp8_inplace[n={n}, stride={stride}]", lambda t, d, g: {"x": _x(t, stride, g, d)},
                   make_outputs, launch, ref, {"x": EXACT_TOL, "x_vs_input": FP8_TOL}, tokens=GPU_TOKENS,
                   fixes={"n": n, "stride": stride})


def _fp4_case(m) -> GpuCase:
    import torch
    from . import ops, reference
    n = int(m.index_head_dim)

    def make_outputs(inp, arch):
        t, dev = inp["x"].shape[0], inp["x"].device
        return {"y": torch.empty(t, n, dtype=torch.float64, device=dev),
                "y_vs_input": torch.empty(t, n, dtype=torch.float64, device=dev),
                "scales": torch.empty(t, n // 32, dtype=torch.float64, device=dev)}

    def launch(inp, out, arch, get_kernel):
        t, dev = inp["x"].shape[0], inp["x"].device
        y = torch.zeros(t, n // 2, dtype=torch.uint8, device=dev)
        s = torch.zeros(t, n // 32, dtype=torch.uint8, device=dev)   # exponent 0 = 2^-127: a miss shows
        ops.act_quant_fp4(inp["x"], arch=arch, get_kernel=get_kernel, out=y, scales=s)
        deq = reference.dequant_fp4(y, s)
        out["y"].copy_(deq)
        out["y_vs_input"].copy_(deq)
        out["scales"].copy_(s.double())

    def ref(inp, out):
        y, s = reference.ref_act_quant_fp4(inp["x"])
        return {"y": reference.dequant_fp4(y, s), "y_vs_input": inp["x"].double(), "scales": s.double()}

    return GpuCase(f"act_quant_fp4[n={n}]", lambda t, d, g: {"x": _x(t, n, g, d)}, make_outputs, launch, ref,
                   {"y": EXACT_TOL, "y_vs_input": FP4_TOL, "scales": 0.0}, tokens=GPU_TOKENS, fixes={"n": n})


def _swiglu_case(m, limit: float) -> GpuCase:
    import torch
    from . import ops, reference
    n = int(m.moe_intermediate_size) * (1 if limit else int(m.n_shared_experts))

    def make_outputs(inp, arch):
        t, dev = inp["gate_up"].shape[0], inp["gate_up"].device
        return {"y": torch.empty(t, n, dtype=torch.float64, device=dev),
                "y_exact": torch.empty(t, n, dtype=torch.float64, device=dev)}

    def launch(inp, out, arch, get_kernel):
        t, dev = inp["gate_up"].shape[0], inp["gate_up"].device
        y = torch.zeros(t, n, dtype=torch.float8_e4m3fn, device=dev)
        s = torch.full((t, n // 128), float("nan"), dtype=torch.float32, device=dev)
        ops.swiglu_quant_fp8(inp["gate_up"], limit=limit, arch=arch, get_kernel=get_kernel, out=y, scales=s)
        deq = reference.dequant_fp8(y, s)
        out["y"].copy_(deq)
        out["y_exact"].copy_(deq)

    def ref(inp, out):
        y, s = reference.ref_swiglu_quant_fp8(inp["gate_up"], limit)
        return {"y": reference.ref_swiglu(inp["gate_up"], limit, torch.float64), "y_exact": reference.dequant_fp8(y, s)}

    # magnitudes up to e^3 x outliers: the clamp at 10 fires on many tokens
    return GpuCase(f"swiglu_quant_fp8[n={n}, limit={limit}]",
                   lambda t, d, g: {"gate_up": _x(t, 2 * n, g, d, (-1.0, 3.0))}, make_outputs, launch, ref,
                   {"y": FP8_TOL, "y_exact": SWIGLU_TOL}, tokens=GPU_TOKENS, fixes={"n": n, "limit": limit})


def _gpu_cases(m) -> list[GpuCase]:
    cases = [_fp8_case(m, int(m.hidden_size)), _fp8_case(m, int(m.o_groups) * int(m.o_lora_rank)),
             _inplace_case(m), _swiglu_case(m, float(m.swiglu_limit))]
    if int(m.n_shared_experts):
        cases.append(_swiglu_case(m, 0.0))
    if 4 in m.layer_ratios:
        cases.append(_fp4_case(m))
    return cases


FAMILY = register_family(KernelFamily(
    name="quant",
    specs=(get_spec("act_quant_fp8"), get_spec("act_quant_fp8_inplace"), get_spec("act_quant_fp4"),
           get_spec("swiglu_quant_fp8")),
    uses=_uses,
    gpu_cases=_gpu_cases,
    ops={"act_quant_fp8": ("act_quant_fp8",), "act_quant_fp8_inplace": ("act_quant_fp8_inplace",),
         "act_quant_fp4": ("act_quant_fp4",), "swiglu_quant_fp8": ("swiglu_quant_fp8",)},
    doc="activation quantization: 1x128 e4m3 / 1x64 in-place e4m3 / 1x32 e2m1, UE8M0 scales; SwiGLU + quant",
))

__all__ = ["FAMILY", "act_quant", "quant_statics"]
