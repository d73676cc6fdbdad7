"""The routed experts' weighted combine (`moe_combine`): each token's top-k expert outputs, read back from the
routed-row layout, summed with the routing weights.

    out[t, :] bf16 = sum_j w[t, j] * C[entry_rows[t * topk + j], :]     (fp32 accumulation, in j order)

C bf16 [M, N] is the w2 grouped GEMM's output in moe_align's layout; entry_rows int32 [T * topk] is the row of
each routed entry in it (ops.moe_entry_rows inverts moe_align's sorted_rows); w fp32 [T, topk] the routing
weights (moe_route). A row index out of [0, M) contributes nothing (never read). Memory-bound: one CTA per token
and 1,024 columns, 8 bf16 per thread. Kernel-defining code only (no host code: the artifact key hashes this module).
"""
# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations.
from typing import Any, Mapping

from dsv4_jit.arch import ArchProfile, check_arch, schedule_name
from dsv4_jit.spec import Variant, register
from dsv4_jit.validate import int_param

from .spec_base import MoeKernelSpec

COLS = 1024
THREADS = 128


def build_moe_combine(*, topk: int, cols: int, threads: int):
    import tilelang.language as T

    K = topk
    f32 = "float32"
    M = T.dynamic("num_rows")
    N = T.dynamic("n")
    NT = T.dynamic("num_tokens")

    @T.prim_func
    def moe_combine(
        c: T.Tensor[(M, N), "bfloat16"],
        entry_rows: T.Tensor[(NT * K,), "int32"],
        weights: T.Tensor[(NT, K), f32],
        out: T.Tensor[(NT, N), "bfloat16"],
    ):
        with T.Kernel(T.ceildiv(N, cols), NT, threads=threads) as (bx, t):
            acc = T.alloc_fragment((cols,), f32)
            T.clear(acc)
            for j in T.serial(K):
                for q in T.Parallel(cols):
                    acc[q] += T.if_then_else(
                        bx * cols + q < N and entry_rows[t * K + j] >= 0 and entry_rows[t * K + j] < M,
                        weights[t, j] * T.Cast(f32, c[T.min(T.max(entry_rows[t * K + j], 0), M - 1),
                                                      T.min(bx * cols + q, N - 1)]),
                        0.0)
            for q in T.Parallel(cols):
                if bx * cols + q < N:
                    out[t, bx * cols + q] = T.Cast("bfloat16", acc[q])

    return moe_combine


@register
class MoeCombineSpec(MoeKernelSpec):
    """Weighted sum of each token's top-k expert rows. Statics: topk (N, M and T are runtime: one variant per
    model)."""
    name = "moe_combine"
    arg_names = ("c", "entry_rows", "weights", "out")

    def static_params(self, model, parallel) -> dict[str, Any]:
        return {"topk": int(model.num_experts_per_tok)}

    def select(self, arch: ArchProfile, static: Mapping[str, Any], num_tokens: int) -> Variant:
        check_arch(self.name, arch)
        self.check_tokens(num_tokens)
        k = int_param(self.name, static, "topk")
        if k > 16:
            raise ValueError(f"{self.name}: topk must be <= 16, got {k}")
        return Variant.make(self.name, {"topk": k, "cols": COLS, "threads": THREADS}, arch, schedule_name(arch))

    def smem_bytes(self, variant: Variant) -> int:
        return 0

    def build(self, variant: Variant):
        return build_moe_combine(**variant.p)
