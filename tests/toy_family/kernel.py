"""toy_rowscale: y[t, h] = x[t, h] * w[h] (bf16 in and out, fp32 math), with w staged in shared memory.

Kernel-defining code only (spec + builder): the artifact key hashes this module's source, so the host op
(ops.py) and the reference can change without re-keying any compiled artifact.
"""
# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations, which name
# builder-local shapes.
from typing import Any, Mapping

from dsv4_jit.arch import ArchProfile, check_arch
from dsv4_jit.spec import KernelSpec, Variant
from dsv4_jit.validate import int_param


def build_rowscale(*, hidden: int, threads: int):
    import tilelang.language as T

    num_tokens = T.dynamic("num_tokens")

    @T.prim_func
    def toy_rowscale(
        x: T.Tensor((num_tokens, hidden), T.bfloat16),
        w: T.Tensor((hidden,), T.bfloat16),
        y: T.Tensor((num_tokens, hidden), T.bfloat16),
    ):
        with T.Kernel(num_tokens, threads=threads) as t:
            w_s = T.alloc_shared((hidden,), T.bfloat16)
            T.copy(w, w_s)
            for h in T.Parallel(hidden):
                y[t, h] = T.Cast(T.bfloat16, T.Cast(T.float32, x[t, h]) * T.Cast(T.float32, w_s[h]))

    return toy_rowscale


class ToyRowScaleSpec(KernelSpec):
    name = "toy_rowscale"
    arg_names = ("x", "w", "y")

    def static_params(self, model, parallel) -> dict[str, Any]:
        return {"hidden": int(model.hidden_size)}

    def select(self, arch: ArchProfile, static: Mapping[str, Any], num_tokens: int) -> Variant:
        # Validate with ValueError (never assert), and read everything from the arch profile passed in
        # (never from the GPU): select must run on a build machine with no GPU.
        check_arch(self.name, arch)
        self.check_tokens(num_tokens)
        hidden = int_param(self.name, static, "hidden", multiple=256)
        # Few variants, chosen from few inputs, so the planner can enumerate them: one CTA per token,
        # wider CTAs once every SM already has a token.
        threads = 128 if num_tokens <= arch.num_sms_hint else 256
        return Variant.make(self.name, {"hidden": hidden, "threads": threads}, arch)

    def smem_bytes(self, variant: Variant) -> int:
        return 2 * variant.p["hidden"]  # w_s, bf16

    def build(self, variant: Variant):
        return build_rowscale(**variant.p)
