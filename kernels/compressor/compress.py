"""DeepSeek V4's KV compressor in TileLang, in the state-cache form an engine runs (reference.py states the math):

  compressor_state_write   every token's fp32 state row [kv | score + ape[p % r]] into the paged state cache
  compressor_compress      every token that completes a window ((p + 1) % r == 0, with an output slot):
                           gather its coff * r state rows through the request's block table, softmax-pool per
                           channel, RMSNorm, interleaved RoPE on the last 64 dims at position r * (p // r), quantize,
                           and write one slot of the compressed cache: an fp8_ds_mla slot (d = 512: 448 e4m3 in 7
                           UE8M0 groups of 64 + 64 bf16) or an index-K slot (d = 128: 128 e4m3 + fp32 scale 2^e)

One CTA per token, d / 4 threads per row group, 4 consecutive channels per thread (so each RoPE pair and each
64-channel quant group stays inside one thread or 16 lanes). Ratio 4 runs one row group (8 rows); ratio 128 runs
four, each pooling 32 of the 128 rows, merged through shared memory (24,576 B). Window rows are gathered 8 at a
time. Tokens that emit nothing exit at once, so a CUDA-graph-sized grid costs only its emitting tokens.

Kernel-defining code only (no host code: the artifact key hashes this module).
"""
# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations.
from typing import Any, Mapping

from dsv4_jit.arch import ArchProfile, check_arch, get_profile, schedule_name
from dsv4_jit.spec import KernelSpec, Variant, register

ROPE = 64
TOKEN_BYTES, SCALE_BYTES = 576, 8
FP8_MAX = 448.0
AMAX_FLOOR = 1e-4
LOG2E = 1.4426950408889634
FORMATS = {512: "fp8_ds_mla", 128: "indexer_fp8"}
STATE_THREADS = 256
# Window rows gathered per round trip: a row at a time, the pooling walked its window serially, one dependent
# block-table + state load per row (128 round trips per ratio-128 token, 8 per ratio-4 token).
GATHER_ROWS = 8
# Row groups of a ratio-128 window: each group of D/4 threads pools 32 of the 128 rows, then the groups' partial
# softmax states merge through shared memory (one group would leave a 512 KB window's gather to 128 threads).
ROW_GROUPS = {4: 1, 128: 4}


def _static(name: str, static: Mapping[str, Any]) -> tuple[int, int]:
    if not isinstance(static, Mapping):
        raise ValueError(f"{name}: static params must be a mapping, got {static!r}")
    ratio, d = static.get("ratio"), static.get("head_dim")
    if ratio not in (4, 128) or isinstance(ratio, bool):
        raise ValueError(f"{name}: ratio must be 4 or 128 (DeepSeek V4's compressed layers), got {ratio!r}")
    if d not in FORMATS or isinstance(d, bool):
        raise ValueError(f"{name}: head_dim must be 512 (attention KV) or 128 (indexer keys), got {d!r}")
    return ratio, d


def build_state_write(*, ratio: int, head_dim: int, threads: int):
    import tilelang.language as T

    R, C = ratio, (2 if ratio == 4 else 1) * head_dim
    num_tokens = T.dynamic("num_tokens")
    rows = T.dynamic("state_rows")

    @T.prim_func
    def compressor_state_write(
        kv_score: T.Tensor[(num_tokens, 2 * C), "float32"],
        ape: T.Tensor[(R, C), "float32"],
        positions: T.Tensor[(num_tokens,), "int32"],
        state_slots: T.Tensor[(num_tokens,), "int32"],
        state: T.Tensor[(rows, 2 * C), "float32"],
    ):
        with T.Kernel(num_tokens, threads=threads) as t:
            slot = state_slots[t]
            if slot >= 0 and slot < rows:
                for c in T.Parallel(C):
                    state[slot, c] = kv_score[t, c]
                    state[slot, C + c] = kv_score[t, C + c] + ape[T.floormod(T.max(positions[t], 0), R), c]

    return compressor_state_write


def build_compress(*, ratio: int, head_dim: int, eps: float):
    import tilelang.language as T

    R, D = ratio, head_dim
    COFF = 2 if ratio == 4 else 1
    C, W = COFF * D, COFF * ratio        # state row half-width; rows per window
    NT = D // 4                          # threads: 4 channels each
    NW = max(1, NT // 32)
    U = min(W, GATHER_ROWS)              # window rows whose loads are issued together
    G = ROW_GROUPS[ratio]                # row groups; threads = G * NT, channel thread ct = tx % NT
    assert W % (U * G) == 0 and (G == 1 or NW > 1), (W, U, G, NW)
    attention = D == 512
    num_tokens = T.dynamic("num_tokens")
    srows = T.dynamic("state_rows")
    batch, max_pages = T.dynamic("batch"), T.dynamic("max_state_pages")
    max_pos = T.dynamic("max_pos")
    pages, pbytes = T.dynamic("cache_pages"), T.dynamic("page_bytes")

    def ceil_log2(x):
        """exact ceil(log2(x)) of a positive normal fp32 x, from its bits (no log2f rounding)"""
        bits = T.reinterpret(x, "int32")
        return T.shift_right(bits + 0x7FFFFF, 23) - 127

    def exp2i(e):
        """2^e (int e in [-126, 127]) as fp32, from its bits"""
        return T.reinterpret(T.shift_left(e + 127, 23), "float32")

    def scale_exponent(amax):
        """e with 2^e >= max(amax, 1e-4) / 448: the power-of-two scale of an e4m3 group"""
        return ceil_log2(T.max(amax, T.float32(AMAX_FLOOR)) / T.float32(FP8_MAX))

    def e4m3(x, e):
        """x / 2^e clamped to +-448, as e4m3"""
        return T.Cast("float8_e4m3fn", T.max(T.min(x * exp2i(-e), T.float32(FP8_MAX)), T.float32(-FP8_MAX)))

    @T.macro
    def pool_norm_rope(state, state_block_table, state_page, positions, req_idx, norm_weight, cos_sin, t, tx,
                       y, red, part):
        """y[v] = channel 4 ct + v after pooling, RMSNorm (bf16-rounded) and RoPE (bf16-rounded), in every row
        group (ct = tx % NT; group g = tx // NT pools rows [g W/G, (g + 1) W/G) of the window)"""
        m = T.alloc_local([4], "float32")
        acc = T.alloc_local([4], "float32")
        den = T.alloc_local([4], "float32")
        sv = T.alloc_local([U * 4], "float32")
        kv = T.alloc_local([U * 4], "float32")
        pg_r = T.alloc_local([U], "int32")
        row_r = T.alloc_local([U], "int32")
        nw = T.alloc_local([4], "float32")
        cs_r = T.alloc_local([4], "float32")
        mn = T.alloc_local([4], "float32")
        ss = T.alloc_var("float32")
        ct = tx % NT
        grp = tx // NT
        p = T.alloc_var("int32")
        q = T.alloc_var("int32")
        req = T.alloc_var("int32")
        p = positions[t]
        req = req_idx[t]              # in range: the kernel's `ok` checked it
        # the norm weights and this thread's RoPE cos / sin depend on nothing the pooling computes: their loads
        # are issued here, so their latency hides behind the gather instead of following the norm's barrier
        for v in T.unroll(4):
            nw[v] = T.Cast("float32", norm_weight[4 * ct + v])
        rp = T.floordiv(p, R) * R     # in range: the kernel's `ok` checked it
        if 4 * ct >= D - ROPE:
            for h in T.unroll(2):
                cs_r[h] = cos_sin[rp, (4 * ct - (D - ROPE)) // 2 + h]
                cs_r[2 + h] = cos_sin[rp, ROPE // 2 + (4 * ct - (D - ROPE)) // 2 + h]
        for v in T.unroll(4):
            m[v] = T.float32(-3.4028234663852886e38)   # -FLT_MAX: a -inf score then weighs 0, not NaN
            acc[v] = T.float32(0)
            den[v] = T.float32(0)
        # the window's rows in chunks of U: the chunk's page lookups, then all its state loads, are issued before
        # any is used (one memory round trip per chunk and kind instead of one per row), then the online softmax
        # folds the rows in order (the same order and arithmetic as one row at a time)
        for ch in T.serial(W // U // G):
            for u in T.unroll(U):
                q = p - W + 1 + (grp * (W // U // G) + ch) * U + u
                pg_r[u] = T.if_then_else(
                    q >= 0, state_block_table[req, T.min(T.floordiv(T.max(q, 0), state_page), max_pages - 1)], -1)
            for u in T.unroll(U):
                q = p - W + 1 + (grp * (W // U // G) + ch) * U + u
                row_r[u] = T.if_then_else(pg_r[u] >= 0, pg_r[u] * state_page + T.floormod(T.max(q, 0), state_page),
                                          srows)
            for u in T.unroll(U):
                # overlap windows: the previous window's rows (j < r) read the first channel half
                for v in T.unroll(4):
                    sv[u * 4 + v] = T.if_then_else(
                        row_r[u] < srows,
                        state[T.min(row_r[u], srows - 1), C + T.if_then_else((grp * (W // U // G) + ch) * U + u >= R, D, 0) + 4 * ct + v], 0)
                    kv[u * 4 + v] = T.if_then_else(
                        row_r[u] < srows,
                        state[T.min(row_r[u], srows - 1), T.if_then_else((grp * (W // U // G) + ch) * U + u >= R, D, 0) + 4 * ct + v], 0)
            for u in T.unroll(U):
                if row_r[u] < srows:
                    for v in T.unroll(4):
                        mn[v] = T.max(m[v], sv[u * 4 + v] * LOG2E)
                        acc[v] = acc[v] * T.exp2(m[v] - mn[v]) + kv[u * 4 + v] * T.exp2(sv[u * 4 + v] * LOG2E - mn[v])
                        den[v] = den[v] * T.exp2(m[v] - mn[v]) + T.exp2(sv[u * 4 + v] * LOG2E - mn[v])
                        m[v] = mn[v]
        if G > 1:
            # merge the groups' (max, numerator, denominator) per channel, in group order, in every group
            for v in T.unroll(4):
                part[grp, 4 * ct + v, 0] = m[v]
                part[grp, 4 * ct + v, 1] = acc[v]
                part[grp, 4 * ct + v, 2] = den[v]
            T.sync_threads()
            for v in T.unroll(4):
                m[v] = part[0, 4 * ct + v, 0]
                acc[v] = part[0, 4 * ct + v, 1]
                den[v] = part[0, 4 * ct + v, 2]
                for g2 in T.unroll(1, G):
                    mn[v] = T.max(m[v], part[g2, 4 * ct + v, 0])
                    acc[v] = acc[v] * T.exp2(m[v] - mn[v]) + part[g2, 4 * ct + v, 1] * T.exp2(
                        part[g2, 4 * ct + v, 0] - mn[v])
                    den[v] = den[v] * T.exp2(m[v] - mn[v]) + part[g2, 4 * ct + v, 2] * T.exp2(
                        part[g2, 4 * ct + v, 0] - mn[v])
                    m[v] = mn[v]
        ss = T.float32(0)
        for v in T.unroll(4):
            # den > 0: the window's own rows (positions p - r + 1 .. p >= 0) are valid unless the block table
            # maps none of them; then the entry is 0, not NaN
            y[v] = T.if_then_else(den[v] > 0, acc[v] / T.max(den[v], T.float32(1e-30)), T.float32(0))
            ss = ss + y[v] * y[v]
        for o in T.unroll(5):
            ss = ss + T.shfl_xor(ss, 16 >> o)
        if NW > 1:
            if tx % 32 == 0 and grp == 0:   # group 0's warps: every group holds the same sums
                red[tx // 32] = ss
            T.sync_threads()
            ss = T.float32(0)
            for w in T.unroll(NW):
                ss = ss + red[w]
        for v in T.unroll(4):
            y[v] = T.Cast("float32", T.Cast("bfloat16", y[v] * T.rsqrt(ss / D + eps) * nw[v]))
        if 4 * ct >= D - ROPE:
            for h in T.unroll(2):
                cs = cs_r[h]
                sn = cs_r[2 + h]
                ev = y[2 * h]
                od = y[2 * h + 1]
                y[2 * h] = T.Cast("float32", T.Cast("bfloat16", ev * cs - od * sn))
                y[2 * h + 1] = T.Cast("float32", T.Cast("bfloat16", od * cs + ev * sn))

    if attention:
        @T.prim_func
        def compressor_compress(
            state: T.Tensor[(srows, 2 * C), "float32"],
            state_block_table: T.Tensor[(batch, max_pages), "int32"],
            state_page: T.int32,
            positions: T.Tensor[(num_tokens,), "int32"],
            req_idx: T.Tensor[(num_tokens,), "int32"],
            out_slots: T.Tensor[(num_tokens,), "int32"],
            norm_weight: T.Tensor[(D,), "bfloat16"],
            cos_sin: T.Tensor[(max_pos, ROPE), "float32"],
            cq: T.Tensor[(pages, pbytes), "float8_e4m3fn"],
            cu: T.Tensor[(pages, pbytes), "uint8"],
            cb: T.Tensor[(pages, pbytes // 2), "bfloat16"],
            block_size: T.int32,
        ):
            with T.Kernel(num_tokens, threads=NT * G) as t:
                tx = T.get_thread_binding()
                ct = tx % NT
                y = T.alloc_local([4], "float32")
                red = T.alloc_shared([4], "float32")
                part = T.alloc_shared([G, D, 3], "float32")
                amax = T.alloc_var("float32")
                e = T.alloc_var("int32")
                slot = out_slots[t]
                ok = (T.floormod(positions[t] + 1, R) == 0 and positions[t] >= 0 and slot >= 0 and block_size > 0
                      and slot < pages * block_size and block_size * (TOKEN_BYTES + SCALE_BYTES) <= pbytes
                      and state_page > 0 and req_idx[t] >= 0 and req_idx[t] < batch
                      and T.floordiv(positions[t], R) * R < max_pos)
                if ok:
                    pool_norm_rope(state, state_block_table, state_page, positions, req_idx, norm_weight, cos_sin,
                                   t, tx, y, red, part)
                    pg = slot // block_size
                    off = slot % block_size
                    # amax of this thread's 64-channel group: 16 lanes (4 channels each)
                    amax = T.max(T.max(T.abs(y[0]), T.abs(y[1])), T.max(T.abs(y[2]), T.abs(y[3])))
                    for o in T.unroll(4):
                        amax = T.max(amax, T.shfl_xor(amax, 8 >> o))
                    e = scale_exponent(amax)
                    if tx < NT:   # row group 0 writes (every group holds the same entry)
                        if 4 * ct < D - ROPE:
                            for v in T.unroll(4):
                                cq[pg, off * TOKEN_BYTES + 4 * ct + v] = e4m3(y[v], e)
                            if ct % 16 == 0:
                                cu[pg, block_size * TOKEN_BYTES + off * SCALE_BYTES + ct // 16] = T.Cast("uint8",
                                                                                                        e + 127)
                        else:
                            for v in T.unroll(4):
                                cb[pg, off * (TOKEN_BYTES // 2) + (D - ROPE) // 2 + 4 * ct - (D - ROPE) + v] = T.Cast(
                                    "bfloat16", y[v])
                    if tx == 0:
                        cu[pg, block_size * TOKEN_BYTES + off * SCALE_BYTES + SCALE_BYTES - 1] = T.uint8(0)

        return compressor_compress

    @T.prim_func
    def compressor_compress_indexer(
        state: T.Tensor[(srows, 2 * C), "float32"],
        state_block_table: T.Tensor[(batch, max_pages), "int32"],
        state_page: T.int32,
        positions: T.Tensor[(num_tokens,), "int32"],
        req_idx: T.Tensor[(num_tokens,), "int32"],
        out_slots: T.Tensor[(num_tokens,), "int32"],
        norm_weight: T.Tensor[(D,), "bfloat16"],
        cos_sin: T.Tensor[(max_pos, ROPE), "float32"],
        cq: T.Tensor[(pages, pbytes), "float8_e4m3fn"],
        cf: T.Tensor[(pages, pbytes // 4), "float32"],
        block_size: T.int32,
    ):
        with T.Kernel(num_tokens, threads=NT * G) as t:
            tx = T.get_thread_binding()
            ct = tx % NT
            y = T.alloc_local([4], "float32")
            red = T.alloc_shared([4], "float32")
            part = T.alloc_shared([G, D, 3], "float32")
            amax = T.alloc_var("float32")
            e = T.alloc_var("int32")
            slot = out_slots[t]
            ok = (T.floormod(positions[t] + 1, R) == 0 and positions[t] >= 0 and slot >= 0 and block_size > 0
                  and slot < pages * block_size and block_size * (D + 4) <= pbytes and state_page > 0
                  and req_idx[t] >= 0 and req_idx[t] < batch and T.floordiv(positions[t], R) * R < max_pos)
            if ok:
                pool_norm_rope(state, state_block_table, state_page, positions, req_idx, norm_weight, cos_sin,
                               t, tx, y, red, part)
                pg = slot // block_size
                off = slot % block_size
                amax = T.max(T.max(T.abs(y[0]), T.abs(y[1])), T.max(T.abs(y[2]), T.abs(y[3])))
                for o in T.unroll(5):
                    amax = T.max(amax, T.shfl_xor(amax, 16 >> o))
                e = scale_exponent(amax)
                if tx < NT:
                    for v in T.unroll(4):
                        cq[pg, off * D + 4 * ct + v] = e4m3(y[v], e)
                if tx == 0:
                    cf[pg, block_size * (D // 4) + off] = exp2i(e)

    return compressor_compress_indexer


class _CompressorSpec(KernelSpec):
    def pass_configs(self, variant: Variant) -> dict[str, Any]:
        cfg = dict(get_profile(variant.schedule).pass_configs)
        cfg["tl.disable_vectorize_256"] = True
        return cfg


@register
class CompressorStateWriteSpec(_CompressorSpec):
    """Statics: ratio (4 / 128), head_dim (512 / 128)."""
    name = "compressor_state_write"
    arg_names = ("kv_score", "ape", "positions", "state_slots", "state")

    def static_params(self, model, parallel) -> dict[str, Any]:
        return {"ratio": 4, "head_dim": int(model.head_dim)}   # the ratio-4 attention site (family.uses: all)

    def select(self, arch: ArchProfile, static: Mapping[str, Any], num_tokens: int) -> Variant:
        check_arch(self.name, arch)
        self.check_tokens(num_tokens)
        ratio, d = _static(self.name, static)
        return Variant.make(self.name, {"ratio": ratio, "head_dim": d, "threads": STATE_THREADS}, arch,
                            schedule_name(arch))

    def smem_bytes(self, variant: Variant) -> int:
        return 0

    def build(self, variant: Variant):
        return build_state_write(**variant.p)


@register
class CompressorCompressSpec(_CompressorSpec):
    """Statics: ratio (4 / 128), head_dim (512: fp8_ds_mla slots / 128: index-K slots), eps (RMSNorm)."""
    name = "compressor_compress"
    arg_names = ("state", "state_block_table", "state_page", "positions", "req_idx", "out_slots", "norm_weight",
                 "cos_sin", "cache_views...", "block_size")

    def static_params(self, model, parallel) -> dict[str, Any]:
        # the ratio-4 attention site (family.uses lists all three)
        return {"ratio": 4, "head_dim": int(model.head_dim), "eps": float(model.rms_norm_eps)}

    def select(self, arch: ArchProfile, static: Mapping[str, Any], num_tokens: int) -> Variant:
        check_arch(self.name, arch)
        self.check_tokens(num_tokens)
        ratio, d = _static(self.name, static)
        eps = static.get("eps")
        if isinstance(eps, bool) or not isinstance(eps, float) or not 0 < eps < 1:
            raise ValueError(f"{self.name}: eps must be a float in (0, 1), got {eps!r}")
        return Variant.make(self.name, {"ratio": ratio, "head_dim": d, "eps": eps}, arch, schedule_name(arch))

    def smem_bytes(self, variant: Variant) -> int:
        # the cross-warp sum of squares (4 fp32) at d 512; the row groups' partial softmax states (G x d x 3 fp32)
        d, g = variant.p["head_dim"], ROW_GROUPS[variant.p["ratio"]]
        return (16 if d == 512 else 0) + (12 * g * d if g > 1 else 0)

    def build(self, variant: Variant):
        return build_compress(**variant.p)
