"""A small real TileLang kernel for testing the compile/load core without the model kernels.

y[t, :] = x[t, :] * 2 through a shared-memory tile of `smem_elems` bf16, so a test can ask for a
schedule that does or does not fit a profile's shared-memory budget."""
from __future__ import annotations

from typing import Any, Mapping

from dsv4_jit.arch import ArchProfile
from dsv4_jit.spec import KernelSpec, Variant


def build_scale2(hidden: int, blk: int, smem_elems: int):
    import tilelang.language as T

    @T.prim_func
    def scale2(x: T.Tensor[(T.dynamic("num_tokens"), hidden), "bfloat16"],
               y: T.Tensor[(T.dynamic("num_tokens"), hidden), "bfloat16"]):
        with T.Kernel(x.shape[0], threads=128) as bx:
            xs = T.alloc_shared((smem_elems,), "bfloat16")
            for h in T.serial(hidden // blk):
                T.copy(x[bx, h * blk:(h + 1) * blk], xs[0:blk])
                for i in T.Parallel(blk):
                    y[bx, h * blk + i] = xs[i] * 2
    return scale2


class ToySpec(KernelSpec):
    name = "toy_scale2"
    arg_names = ("x", "y")

    def __init__(self, smem_elems: int = 1024):
        self.smem_elems = smem_elems

    def static_params(self, model, parallel) -> dict[str, Any]:
        return {"hidden": model.hidden_size}

    def select(self, arch: ArchProfile, static: Mapping[str, Any], num_tokens: int) -> Variant:
        self.check_tokens(num_tokens)
        blk = 1024 if num_tokens < 64 else 512
        return Variant.make(self.name, {"hidden": static["hidden"], "blk": blk, "smem_elems": self.smem_elems}, arch)

    def build(self, variant: Variant):
        p = variant.p
        return build_scale2(p["hidden"], p["blk"], p["smem_elems"])

    def smem_bytes(self, variant: Variant) -> int:
        return variant.p["smem_elems"] * 2
