"""The toy family's declaration: kernels, call sites, GPU cases. A real family ends with
`FAMILY = register_family(KernelFamily(...))` and is imported from kernels/__init__.py."""
from __future__ import annotations

from dsv4_jit.family import GpuCase, KernelFamily, KernelUse

from . import ops, reference


def _uses(model, parallel) -> list[KernelUse]:
    return [KernelUse(ops.SPEC, ops.SPEC.static_params(model, parallel), "toy rowscale")]


def _gpu_cases(model) -> list[GpuCase]:
    import torch
    hidden = model.hidden_size

    def make_inputs(t, device, g):
        return {"x": torch.randn(t, hidden, generator=g).to(torch.bfloat16).to(device),
                "w": (torch.rand(hidden, generator=g) + 0.5).to(torch.bfloat16).to(device)}

    def make_outputs(inp, arch):
        return {"y": torch.empty_like(inp["x"])}

    def launch(inp, out, arch, get_kernel):
        ops.toy_rowscale(inp["x"], inp["w"], arch=arch, get_kernel=get_kernel, out=out["y"])

    def ref(inp, out):
        return {"y": reference.ref_rowscale(inp["x"], inp["w"])}

    return [GpuCase("toy_rowscale", make_inputs, make_outputs, launch, ref, {"y": 1e-2}, tokens=(1, 7, 300, 4096))]


FAMILY = KernelFamily(name="toy", specs=(ops.SPEC,), uses=_uses, gpu_cases=_gpu_cases,
                      ops={"toy_rowscale": ("toy_rowscale",)}, doc="docs/adding_a_kernel.md's example")
