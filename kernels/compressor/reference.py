"""Torch references of DeepSeek V4's KV compressor, in the state-cache form an engine runs (vLLM 0.33's layout:
a paged fp32 row per token, addressed by absolute position), and a literal transcription of the model's own
contiguous form that the state-cache reference is checked against.

Per layer with compress ratio r (4 or 128), head dim d (512: the attention KV; 128: the indexer's keys),
coff = 2 when r == 4 (overlapping windows) else 1, C = coff * d:
  state row of token t (absolute position p):  [kv_t (C) | score_t + ape[p % r] (C)]  fp32
  entry i (emitted at the token with p = r*i + r - 1), per channel c < d:
      rows  = r = 128: positions r*i .. r*i + r - 1, channel c
              r = 4:   positions 4(i-1) .. 4i - 1 at channel c (the overlap half), then 4i .. 4i + 3 at d + c;
                       positions < 0 are masked (score -inf, kv 0)
      pooled[c] = sum_rows softmax_rows(score)[row] * kv[row]              (fp32, softmax per channel)
  y = bf16(RMSNorm(pooled) * norm_weight)  (eps = rms_norm_eps; fp32 math)
  RoPE (interleaved pairs 2k, 2k+1) on the last 64 dims at position r*i with the engine's cos/sin table
      [max_pos, 64] fp32 = [cos(32) | sin(32)], in fp32, rounded to bf16
  attention (d = 512): the 448 NoPE dims quantized in 7 groups of 64 to e4m3 with a UE8M0 scale
      e = ceil(log2(max(amax, 1e-4) / 448)) (from the bf16 values before RoPE; RoPE leaves them unchanged), the
      RoPE dims stored bf16: one fp8_ds_mla slot (kernels/attention/reference.py's codec)
  indexer (d = 128): after RoPE, one block of 128 to e4m3 with the fp32 scale 2^e (same e rule): one slot of the
      paged index-K cache [page_size x 128 fp8 | page_size x fp32 scale] the indexer kernels read
Facts: dsv4_kernels.md 3.12 and the notes taken from vLLM 0.33's compressor (no code copied).
"""
from __future__ import annotations

import torch

FP8_MAX = 448.0
AMAX_FLOOR = 1e-4
ROPE = 64


def coff_of(ratio: int) -> int:
    return 2 if ratio == 4 else 1


def state_rows(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, positions: torch.Tensor, ratio: int):
    """[T, 2C] fp32 state rows: kv and score + ape[position % ratio]."""
    return torch.cat([kv.float(), score.float() + ape.float()[positions.long() % ratio]], 1)


def pool_entry(rows: torch.Tensor, valid: torch.Tensor, d: int, ratio: int) -> torch.Tensor:
    """rows [coff*r, 2C] (oldest first), valid [coff*r] -> pooled [d] (float64 math)."""
    c = rows.shape[1] // 2
    kv, sc = rows[:, :c].double(), rows[:, c:].double()
    if ratio == 4:
        kv = torch.cat([kv[:ratio, :d], kv[ratio:, d:]], 0)
        sc = torch.cat([sc[:ratio, :d], sc[ratio:, d:]], 0)
    sc = torch.where(valid[:, None], sc, torch.full_like(sc, float("-inf")))
    kv = torch.where(valid[:, None], kv, torch.zeros_like(kv))
    return (torch.softmax(sc, 0) * kv).sum(0)


def norm_rope(pooled: torch.Tensor, norm_weight: torch.Tensor, eps: float, cos_sin: torch.Tensor,
              rope_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(y bf16-rounded normed values [d] as float64, y with RoPE on the last 64 dims, bf16-rounded, float64)."""
    x = pooled.double()
    y = x * torch.rsqrt((x * x).mean() + eps) * norm_weight.double()
    y = y.to(torch.bfloat16).double()
    cos, sin = cos_sin[rope_pos, :ROPE // 2].double(), cos_sin[rope_pos, ROPE // 2:].double()
    r = y.clone()
    e, o = y[-ROPE::2], y[-ROPE + 1::2]
    r[-ROPE::2] = e * cos - o * sin
    r[-ROPE + 1::2] = o * cos + e * sin
    return y, r.to(torch.bfloat16).double()


def e8_exponent(amax: torch.Tensor) -> torch.Tensor:
    """The power-of-two scale exponent e with 2^e >= amax / 448 (amax floored at 1e-4)."""
    x = amax.float().clamp_min(AMAX_FLOOR) / FP8_MAX      # in fp32, as the kernel divides
    return torch.ceil(torch.log2(x.double()))


def quant_attention_row(y: torch.Tensor, r: torch.Tensor):
    """-> (nope fp8 [448], exponent bytes uint8 [7], rope bf16 [64]) of one attention entry."""
    nope = y[:-ROPE].reshape(-1, 64)
    e = e8_exponent(nope.abs().amax(1))
    q = (nope / torch.exp2(e)[:, None]).clamp(-FP8_MAX, FP8_MAX).float().to(torch.float8_e4m3fn)
    return q.reshape(-1), (e + 127).clamp(0, 255).to(torch.uint8), r[-ROPE:].to(torch.bfloat16)


def quant_indexer_row(r: torch.Tensor):
    """-> (fp8 [128], fp32 scale 2^e) of one index-K entry (after RoPE)."""
    e = e8_exponent(r.abs().amax())
    return (r / torch.exp2(e)).clamp(-FP8_MAX, FP8_MAX).float().to(torch.float8_e4m3fn), torch.exp2(e).float()


def ref_compress(state: torch.Tensor, state_block_table: torch.Tensor, state_page: int, positions: torch.Tensor,
                 req_idx: torch.Tensor, out_slots: torch.Tensor, norm_weight: torch.Tensor, cos_sin: torch.Tensor,
                 *, ratio: int, eps: float) -> dict[int, tuple[torch.Tensor, torch.Tensor, int]]:
    """Every entry the tokens emit: {out_slot: (y, r, rope_pos)} (float64 values before quantization).

    state [pages * state_page, 2C] fp32 rows; token t's window rows are read through its request's block table
    at positions p - coff*r + 1 .. p. A token emits iff (p + 1) % r == 0 and out_slots[t] >= 0."""
    d = norm_weight.shape[0]
    w = coff_of(ratio) * ratio
    out = {}
    for t in range(positions.shape[0]):
        p, slot = int(positions[t]), int(out_slots[t])
        if slot < 0 or (p + 1) % ratio:
            continue
        q = torch.arange(p - w + 1, p + 1)
        valid = q >= 0
        qc = q.clamp_min(0)
        rows = state[(state_block_table[int(req_idx[t]), qc // state_page].long() * state_page + qc % state_page)]
        y, r = norm_rope(pool_entry(rows, valid, d, ratio), norm_weight, eps, cos_sin, (p // ratio) * ratio)
        out[slot] = (y, r, (p // ratio) * ratio)
    return out


def transcription_compress(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, ratio: int) -> torch.Tensor:
    """The model's contiguous prefill form, literally: one sequence of T tokens (T a multiple of ratio) ->
    pooled entries [T // ratio, d] (float64), by its window/overlap construction (score + ape per window row,
    the previous window's first-half channels in rows 0..r-1 padded with -inf / 0 for the first window)."""
    t, c = kv.shape
    coff = coff_of(ratio)
    d = c // coff
    n = t // ratio
    kv = kv.double().reshape(n, ratio, c)
    score = (score.float().reshape(n, ratio, c) + ape.float()[None]).double()   # the model adds ape in fp32
    if coff == 2:
        kv2 = torch.zeros(n, 2 * ratio, d, dtype=torch.float64)
        sc2 = torch.full((n, 2 * ratio, d), float("-inf"), dtype=torch.float64)
        kv2[:, ratio:] = kv[:, :, d:]
        sc2[:, ratio:] = score[:, :, d:]
        kv2[1:, :ratio] = kv[:-1, :, :d]
        sc2[1:, :ratio] = score[:-1, :, :d]
        kv, score = kv2, sc2
    return (kv * score.softmax(dim=1)).sum(dim=1)


def dequant_entry(y: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """The value a reader decodes from the entry the reference quantizes (float64 [d])."""
    d = y.shape[0]
    if d == 512:
        q, e, rope = quant_attention_row(y, r)
        nope = q.double().reshape(-1, 64) * torch.exp2(e.double() - 127)[:, None]
        return torch.cat([nope.reshape(-1), rope.double()])
    q, s = quant_indexer_row(r)
    return q.double() * s.double()
