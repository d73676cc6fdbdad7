"""Sparse MLA attention with the learned sink: the kernel specs and their schedule rules (select). The kernels:
decode.py (fp8_ds_mla paged cache), prefill.py (gathered bf16 rows), combine.py (split-KV merge + sink), sharing
common.py's per-tile math.

Schedules. sm_90a / sm_100a: HB = 64 (one CTA reads a candidate tile for all 64 heads), BI = 32; on Hopper
(WGMMA) BI = 64 where a token's list is split at most 2 ways (the fp8 ring) or not at all (prefill) (kv_tile).
SM12x: the fp8 decode also runs 64 heads a CTA, over 16-candidate tiles (99,392 B with the ring; the public
one-CTA-per-64-heads tiling with 64-row tiles needs 141,312 B, which SM120 cannot launch); the bf16 prefill keeps
HB <= 32 with BI = 32. 256 threads (16 heads: 128). Split counts fill the SMs (num_splits); a few tokens at 64+
heads run 32-head CTAs (SMALL_STEP_HEAD_BLOCK).
"""
# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations.
import math
import sys
from typing import Any, Mapping

from dsv4_jit.arch import ArchProfile, check_arch, ctas_by_smem, schedule_name
from dsv4_jit.spec import KernelSpec, Variant, register
from dsv4_jit.validate import int_param

from . import combine, common, decode, decode_ws, prefill
from .combine import build_combine, combine_params, combine_smem_bytes
from .common import (D, GROUP, KV_FORMATS, LOG2E, NOPE, ROPE, SCALE_BYTES, SPAD, TOKEN_BYTES, pass_configs_for,
                     smem_bytes_for)
from .decode import DEQUANT8_SRC, build_decode, e4m3_bf16_bits
from .decode_ws import WS_BLOCK_I, WS_HEAD_BLOCK, WS_THREADS, build_decode_ws, ws_smem_bytes
from .prefill import build_prefill

SPLITS = (1, 2, 4, 8, 16, 32, 64)
# the layout constants and kernel helpers ops, tests and benchmarks read from here
__all__ = ["D", "GROUP", "KV_FORMATS", "LOG2E", "NOPE", "ROPE", "SCALE_BYTES", "SPAD", "TOKEN_BYTES", "DEQUANT8_SRC",
           "SPLITS", "build_combine", "build_sparse_mla", "combine_params", "ctas_per_sm", "e4m3_bf16_bits",
           "head_block", "kv_stages", "kv_tile", "narrow_tile", "num_splits", "pass_configs_for", "smem_bytes_for",
           "SparseMlaCombineSpec", "SparseMlaSpec", "attention_statics", "combine_for"]


def head_block(heads: int, arch: ArchProfile, kv_format: str = "fp8_ds_mla") -> int:
    """Heads per CTA: 16 (the mma.sync row tile) up to 64. On SM12x the bf16 prefill stops at 32 (Q and a
    32-row tile must fit 101,376 B); the fp8 decode goes to 64 over 16-row tiles (narrow_tile). H = 8 (V4-Flash at
    TP 8) runs padded to 16, the pad rows masked."""
    cap = 32 if arch.family == "blackwell_consumer" and kv_format != "fp8_ds_mla" else 64
    hb = 16
    while hb < cap and hb < heads:
        hb *= 2
    return hb


WIDE_TILE_MAX_SPLITS = 2  # 64-candidate tiles where a token's list is split at most this many ways


def narrow_tile(hb: int, arch: ArchProfile) -> int:
    """Candidates per tile before kv_tile widens it: 32, or 16 for 64-head CTAs on SM12x, whose Q, 32-row tile and
    ring stage (131,456 B) do not fit 101,376 B; 16 rows fit (99,392 B). One 64-head CTA dequantizes a candidate
    once for all heads where two 32-head CTAs did it twice: sparse MLA at 64 heads x 64 tokens, the SM120 schedule
    on the H100, 73.3 -> 65.5 us at 64K (ratio 4) and 210.3 -> 182.0 us at 256K (ratio 128)
    (sweep_attention_schedules; at 8 tokens equal, where select keeps 32-head CTAs)."""
    return 16 if hb >= 64 and arch.family == "blackwell_consumer" else 32


def kv_tile(wgmma_cta: bool, n_splits: int, ring: bool) -> int:
    """Candidates per tile: 32, or 64 for a WGMMA CTA (64 heads on Hopper) that walks a long share of its token's
    list: the fp8 ring split at most 2 ways, or the bf16 prefill kernel unsplit. Each WGMMA warp group then
    computes 32 score columns a tile instead of 16, so the per-tile work (barriers, softmax, the score WGMMAs'
    descriptors) covers twice the candidates (sweep_attention_schedules: faster at batch 64 and in prefill, slower
    at 16 splits). SM12x's 101,376 B cannot hold a 64-row tile at 32 heads (149,632 B). The fp8 register path
    (one-token steps, 64 splits) keeps 32."""
    if wgmma_cta and (n_splits <= WIDE_TILE_MAX_SPLITS if ring else n_splits == 1):
        return 64
    return 32


def kv_stages(hb: int, bi: int, arch: ArchProfile, n_splits: int) -> int:
    """The fp8 gather's pipeline: a 1-stage cp.async ring (the next tile's bytes go global -> shared while this
    tile is multiplied, no register held), or 0: through registers. The ring beats registers wherever a CTA has
    tiles to pipeline, and one stage matches or beats two or three (sweep_attention_schedules). Registers stay where
    a CTA has almost nothing to pipeline and 64 heads fill its registers (64 splits, 0-2 tiles a CTA); select then
    takes 32-head CTAs through the ring instead (SMALL_STEP_HEAD_BLOCK)."""
    if hb >= 64 and n_splits >= SPLITS[-1]:
        return 0
    return 1 if smem_bytes_for(hb, bi, 1) <= arch.max_smem_per_block else 0


def ctas_per_sm(arch: ArchProfile, smem: int, threads: int) -> int:
    """CTAs of this variant one SM holds: __launch_bounds__(threads, 1) lets nvcc take up to 255 registers a
    thread, so they are counted at 255 (ptxas: 255 at 64 and 16 heads a CTA, 243 at 32); each CTA also reserves
    1 KB of shared memory."""
    by_regs = 65536 // (threads * 256)
    return max(1, min(by_regs, ctas_by_smem(arch, smem)))


def num_splits(num_tokens: int, head_blocks: int, num_sms: int, per_sm: int = 1) -> int:
    """Splits of each token's candidate list: the largest of SPLITS (1 .. 64) that keeps
    tokens x head blocks x splits within what the SMs hold at once (per_sm CTAs each), so a small decode batch
    still fills the GPU and a large one pays no combine. Depends on the token count only (never on context
    length), so the planner enumerates every value."""
    per = num_sms * per_sm // max(1, num_tokens * head_blocks)
    s = 1
    while s * 2 <= min(per, SPLITS[-1]):
        s *= 2
    return s


# Heads a CTA of the fp8 decode where 64-head CTAs would split a token's list SMALL_STEP_SPLITS or more ways and the
# warp-specialized kernel does not take them (a few tokens: up to 4 at 64 heads on a 132-SM Hopper, up to 8 on SM12x),
# registers gathering for them included (sweep of both on the H100: 10-24% faster up to there, slower at 8 splits)
SMALL_STEP_HEAD_BLOCK = 32
SMALL_STEP_SPLITS = 16


def _schedule(arch: ArchProfile, heads: int, hb: int, fmt: str, num_tokens: int) -> tuple[int, bool, int, int, int]:
    """(threads, WGMMA CTA, splits, fp8 stages, candidates a tile) of `hb` heads a CTA."""
    # 8 warps hide the gather's latency; a 16-row head block splits over 4 (mma.sync needs 16 rows x 8
    # columns per warp, and the 32-wide score tile has only 4 such column blocks)
    threads = 128 if hb == 16 else 256
    # T.gemm lowers to WGMMA where the GPU has it and a CTA's head block fills a warp group's 64 rows
    wgmma_cta = arch.has_wgmma and hb >= 64
    # the split count as the ring would run with narrow tiles; where registers take over, their
    # footprint holds at least as many CTAs an SM (the count stands), and a 64-candidate tile is chosen
    # only where one CTA an SM runs either way (64 heads on Hopper)
    ring = 1 if fmt == "fp8_ds_mla" else 0
    bi = narrow_tile(hb, arch)
    per_sm = ctas_per_sm(arch, smem_bytes_for(hb, bi, ring), threads)
    n_splits = num_splits(num_tokens, math.ceil(heads / hb), arch.num_sms_hint, per_sm)
    stages = kv_stages(hb, bi, arch, n_splits) if fmt == "fp8_ds_mla" else 0
    return threads, wgmma_cta, n_splits, stages, kv_tile(wgmma_cta, n_splits, stages > 0) if bi == 32 else bi


WS_MAX_SPLITS = 16  # the warp-specialized decode where a token's list is split at most this many ways


def ws_fits(arch: ArchProfile, heads: int, hb: int, n_splits: int) -> bool:
    """Where the fp8 decode runs decode_ws.py's warp-specialized kernel: a Hopper CTA of 64 heads (heads a multiple
    of 64) over a token's list split at most WS_MAX_SPLITS ways (from 5 tokens at 64 heads, 3 at 128). At 2 splits
    the pair is one thread block cluster merging in the launch (select: `cluster`; no combine kernel). H100, per
    layer, against the 8-warp ring kernel (benchmarks/RESULTS.md): V4-Pro TP 1 (128 heads) x 64 tokens at 64K
    76.9 -> 55.2 us; 64 heads x 64 tokens 256K (ratio 128) 97.0 -> 92.2, 8K 26.6 -> 25.0, 64K (ratio 4) level
    (40.7 / 40.9); x 32 tokens (4 splits) 30.5 -> 29.0. H200, per layer, against the 32-head ring CTAs select ran
    at 5-8 tokens and the 64-head ones at 9-16 (trace_attention.py --set): 64 heads x 8 tokens over 16 splits 34.3
    -> 22.6 us at 256K (ratio 128), 16.4 -> 15.6 at 64K, but 10.6 -> 14.3 at 8K, whose 192 candidates are 3
    64-row tiles (3 live CTAs a token); x 16 tokens over 8 splits 37.0 -> 28.7 at 256K, 18.8 -> 18.0 at 64K,
    13.0 -> 14.2 at 8K; 128 heads x 8 tokens 36.7 -> 27.6 at 256K, 18.5 -> 17.4 at 64K. select cannot see the list
    lengths (the split count follows the token count only); the long lists, where decode is slowest, decide it.
    At 4 tokens (32 splits) the ring kernel stays: ws over 32 splits 23.3 -> 18.6 at 256K but 13.3 -> 14.9 at 64K
    and 10.1 -> 14.1 at 8K."""
    return (arch.has_wgmma and hb == WS_HEAD_BLOCK and heads % WS_HEAD_BLOCK == 0 and n_splits <= WS_MAX_SPLITS
            and ws_smem_bytes() <= arch.max_smem_per_block)


def ws_params(heads: int, n_splits: int, scale: float, cluster: bool = False) -> dict[str, Any]:
    p = {"heads": heads, "head_block": WS_HEAD_BLOCK, "block_i": WS_BLOCK_I, "threads": WS_THREADS,
         "kv_format": "fp8_ds_mla", "n_splits": n_splits, "softmax_scale": scale, "warp_specialized": True}
    if cluster:
        p["cluster"] = True
    return p


def build_sparse_mla(heads: int, head_block: int, block_i: int, threads: int, kv_format: str, n_splits: int,
                     softmax_scale: float, stages: int = 0, score_chains: int = 0, warp_specialized: bool = False,
                     cluster: bool = False, trace: bool = False, score_halves: bool | None = None):
    """The forward kernel of a variant: decode.py's over the fp8_ds_mla cache (decode_ws.py's where
    warp_specialized), prefill.py's over bf16 rows. trace=True (never selected; benchmarks/attention/
    trace_attention.py) adds a timeline buffer to the fp8 decode kernels (trace.py)."""
    if kv_format not in KV_FORMATS:
        raise ValueError(f"sparse_mla: kv_format must be one of {KV_FORMATS}, got {kv_format!r}")
    if cluster and not warp_specialized:
        raise ValueError("sparse_mla: the cluster merge is the warp-specialized decode's (warp_specialized=True)")
    if score_halves and (warp_specialized or kv_format != "fp8_ds_mla"):
        raise ValueError("sparse_mla: score_halves is the fp8 ring decode's (decode.py); the warp-specialized decode "
                         "and the bf16 prefill have their own scores")
    if warp_specialized:
        if (kv_format, head_block, block_i, threads) != ("fp8_ds_mla", WS_HEAD_BLOCK, WS_BLOCK_I, WS_THREADS):
            raise ValueError(f"sparse_mla: the warp-specialized decode is fp8_ds_mla, {WS_HEAD_BLOCK} heads x "
                             f"{WS_BLOCK_I} candidates, {WS_THREADS} threads; got {kv_format}, {head_block} x "
                             f"{block_i}, {threads}")
        return build_decode_ws(heads, n_splits, softmax_scale, cluster, trace)
    if kv_format == "fp8_ds_mla":
        return build_decode(heads, head_block, block_i, threads, n_splits, softmax_scale, stages, score_chains,
                            trace, score_halves)
    if stages:
        raise ValueError(f"sparse_mla: stages must be 0 (registers) or 1..4 (the fp8_ds_mla cp.async ring), got "
                         f"{stages} for {kv_format}")
    return build_prefill(heads, head_block, block_i, threads, n_splits, softmax_scale, score_chains)


def _static_heads_scale(name: str, static: Mapping[str, Any]) -> tuple[int, float, str]:
    heads = int_param(name, static, "heads", lo=1, hi=256)
    scale = static.get("softmax_scale")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < float(scale) < 1:
        raise ValueError(f"{name}: softmax_scale must be a float in (0, 1), got {scale!r}")
    fmt = static.get("kv_format", "fp8_ds_mla")
    if fmt not in KV_FORMATS:
        raise ValueError(f"{name}: kv_format must be one of {KV_FORMATS}, got {fmt!r}")
    if static.get("head_dim", D) != D or static.get("rope_dim", ROPE) != ROPE:
        raise ValueError(f"{name}: head_dim/rope_dim must be {D}/{ROPE} (DeepSeek V4), got "
                         f"{static.get('head_dim')}/{static.get('rope_dim')}")
    return heads, float(scale), fmt


def attention_statics(model, parallel, kv_format: str) -> dict[str, Any]:
    heads = model.num_attention_heads // parallel.tp_size
    if heads < 1 or model.num_attention_heads % parallel.tp_size:
        raise ValueError(f"attention: {model.num_attention_heads} heads do not split over TP {parallel.tp_size}")
    return {"heads": heads, "head_dim": int(model.head_dim), "rope_dim": int(model.qk_rope_head_dim),
            "softmax_scale": float(model.head_dim ** -0.5), "kv_format": kv_format}


@register
class SparseMlaSpec(KernelSpec):
    name = "sparse_mla_fwd"
    # the modules whose source defines this kernel (the artifact key's fingerprint): select here, the kernels there
    source_modules = (sys.modules[__name__], common, decode, decode_ws, prefill)

    def static_params(self, model, parallel) -> dict[str, Any]:
        return attention_statics(model, parallel, "fp8_ds_mla")

    def select(self, arch: ArchProfile, static: Mapping[str, Any], num_tokens: int) -> Variant:
        check_arch(self.name, arch)
        self.check_tokens(num_tokens)
        heads, scale, fmt = _static_heads_scale(self.name, static)
        hb = head_block(heads, arch, fmt)
        threads, wgmma_cta, n_splits, stages, bi = _schedule(arch, heads, hb, fmt, num_tokens)
        if fmt == "fp8_ds_mla" and ws_fits(arch, heads, hb, n_splits):
            # Hopper, 64-head CTAs: the warp-specialized kernel, split as the 64-head ring CTAs would be
            return Variant.make(self.name, ws_params(heads, n_splits, scale, cluster=n_splits == 2), arch,
                                schedule_name(arch))
        if fmt == "fp8_ds_mla" and hb > SMALL_STEP_HEAD_BLOCK and n_splits >= SMALL_STEP_SPLITS:
            # a few tokens at 64+ heads: 32-head CTAs (twice the CTAs a token, each moving half of Q and of the
            # partial O, all through the cp.async ring) beat 64-head CTAs that split each list 16+ ways
            hb = SMALL_STEP_HEAD_BLOCK
            threads, wgmma_cta, n_splits, stages, bi = _schedule(arch, heads, hb, fmt, num_tokens)
        params = {"heads": heads, "head_block": hb, "block_i": bi, "threads": threads, "kv_format": fmt,
                  "n_splits": n_splits, "softmax_scale": scale}
        if stages:
            params["stages"] = stages
        if wgmma_cta:
            params["score_chains"] = 1
        return Variant.make(self.name, params, arch, schedule_name(arch))

    def build(self, variant: Variant):
        return build_sparse_mla(**variant.p)

    def smem_bytes(self, variant: Variant) -> int:
        p = variant.p
        if p.get("warp_specialized"):
            return ws_smem_bytes(p["head_block"], p["block_i"], p.get("cluster", False))
        return smem_bytes_for(p["head_block"], p["block_i"], p.get("stages", 0))

    def pass_configs(self, variant: Variant) -> dict[str, Any]:
        return pass_configs_for(variant)


@register
class SparseMlaCombineSpec(KernelSpec):
    name = "sparse_mla_combine"
    source_modules = (sys.modules[__name__], common, combine)

    def static_params(self, model, parallel) -> dict[str, Any]:
        return attention_statics(model, parallel, "fp8_ds_mla")

    def select(self, arch: ArchProfile, static: Mapping[str, Any], num_tokens: int) -> Variant:
        """The combine matching SparseMlaSpec.select at the same token count (n_splits > 1 only)."""
        return combine_for(arch, SparseMlaSpec().select(arch, static, num_tokens), num_tokens)

    def build(self, variant: Variant):
        return build_combine(**variant.p)

    def smem_bytes(self, variant: Variant) -> int:
        return combine_smem_bytes(variant.p["groups"])

    def pass_configs(self, variant: Variant) -> dict[str, Any]:
        return pass_configs_for(variant)


def combine_for(arch: ArchProfile, fwd: Variant, num_tokens: int) -> Variant:
    """The combine that merges forward variant `fwd`'s splits at `num_tokens` (select's pairing; also for a variant
    select does not pick, as the schedule benchmarks build). Where the forward kernel does not split, or merges its two
    splits in a cluster, no combine runs; this still names the 2-split combine (compiled anyway for the token counts
    that split) so the planner's enumeration stays total."""
    p = fwd.p
    params = combine_params(p["heads"], max(2, p["n_splits"]), num_tokens, p["block_i"])
    return Variant.make(SparseMlaCombineSpec.name, params, arch, schedule_name(arch))
