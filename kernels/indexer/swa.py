"""Sliding-window index preparation (`indexer_swa_indices`) for the SWA part of every layer's attention:
query token t at absolute position p = positions[t] of request r = req_idx[t] attends to the last
n = min(window, p + 1) tokens p - n + 1 .. p. The SWA KV cache is PAGED (vLLM layout: a block table per
request over the uncompressed token positions), so
    swa_indices[t, w] = block_table[r, q // page_size] * page_size + q % page_size, q = p - n + 1 + w, w < n
and -1 for w >= n (oldest first); swa_lengths[t] = n. A ring-buffer cache (SGLang: seq_slot * W + q % W) is
the special case of a one-page-per-request table with page_size = window, when every new token's KV is
written before the prep runs.

Kernel-defining code only (no host code: the artifact key hashes this module).
"""
# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations.
from typing import Any, Mapping

from dsv4_jit.arch import ArchProfile, get_profile
from dsv4_jit.spec import KernelSpec, Variant, register

from dsv4_jit.arch import check_arch, schedule_name
from dsv4_jit.validate import int_param

SWA_THREADS = 128


def build_swa_indices(*, window: int, page_size: int, threads: int):
    import tilelang.language as T

    P, W = page_size, window
    TB = max(1, threads * 4 // W)      # tokens per CTA: 4 entries per thread
    num_tokens = T.dynamic("num_tokens")
    batch = T.dynamic("batch")
    max_pages = T.dynamic("max_pages")

    @T.prim_func
    def indexer_swa_indices(
        positions: T.Tensor[(num_tokens,), "int32"],
        req_idx: T.Tensor[(num_tokens,), "int32"],
        block_table: T.Tensor[(batch, max_pages), "int32"],
        swa_indices: T.Tensor[(num_tokens, W), "int32"],
        swa_lengths: T.Tensor[(num_tokens,), "int32"],
    ):
        with T.Kernel(T.ceildiv(num_tokens, TB), threads=threads) as bx:
            for tb, w in T.Parallel(TB, W):
                if bx * TB + tb < num_tokens:
                    swa_indices[bx * TB + tb, w] = T.if_then_else(
                        w < T.min(W, T.max(positions[bx * TB + tb] + 1, 0)),
                        T.if_then_else(
                            block_table[T.min(T.max(req_idx[bx * TB + tb], 0), batch - 1),
                                        T.min(T.max(T.floordiv(positions[bx * TB + tb] - T.min(W, T.max(positions[bx * TB + tb] + 1, 0)) + 1 + w, P), 0), max_pages - 1)] < 0,
                            -1,
                            block_table[T.min(T.max(req_idx[bx * TB + tb], 0), batch - 1),
                                        T.min(T.max(T.floordiv(positions[bx * TB + tb] - T.min(W, T.max(positions[bx * TB + tb] + 1, 0)) + 1 + w, P), 0), max_pages - 1)] * P
                            + T.floormod(positions[bx * TB + tb] - T.min(W, T.max(positions[bx * TB + tb] + 1, 0)) + 1 + w, P)),
                        -1)
            for tb in T.Parallel(TB):
                if bx * TB + tb < num_tokens:
                    swa_lengths[bx * TB + tb] = T.min(W, T.max(positions[bx * TB + tb] + 1, 0))

    return indexer_swa_indices


@register
class IndexerSwaIndicesSpec(KernelSpec):
    """Sliding-window index lists over a paged SWA cache. Statics: window, page_size."""
    name = "indexer_swa_indices"
    arg_names = ("positions", "req_idx", "block_table", "swa_indices", "swa_lengths")

    def static_params(self, model, parallel) -> dict[str, Any]:
        return {"window": int(model.sliding_window)}  # page_size per call site (family.uses)

    def select(self, arch: ArchProfile, static: Mapping[str, Any], num_tokens: int) -> Variant:
        check_arch(self.name, arch)
        self.check_tokens(num_tokens)
        window = int_param(self.name, static, "window")
        if window % 32 or window > 4096:
            raise ValueError(f"{self.name}: window={window} must be a multiple of 32 up to 4096")
        page_size = int_param(self.name, static, "page_size", allowed=(16, 32, 64, 128, 256))
        p = {"window": window, "page_size": page_size, "threads": SWA_THREADS}
        return Variant.make(self.name, p, arch, schedule_name(arch))

    def smem_bytes(self, variant: Variant) -> int:
        return 0  # registers only

    def build(self, variant: Variant):
        return build_swa_indices(**variant.p)

    def pass_configs(self, variant: Variant) -> dict[str, Any]:
        return dict(get_profile(variant.schedule).pass_configs)
