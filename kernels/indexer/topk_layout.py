"""What the decode logits kernel (logits.py) and the top-k kernels (topk.py) share: the order-preserving key of a
logit and its first select digit, when a row is split over CTAs, and the split top-k's row workspace.

The decode logits kernel can fill a split row's first histogram (G0) while it writes the logits, so the top-k
starts from the finished histogram instead of counting its slices and meeting at a row barrier (topk.py).

Kernel-defining code only (no host code: the artifact key hashes this module).
"""
from typing import Any

RADIX = 256
PASSES = 4  # 8 bits each over the 32-bit key
# The resident select's digits: the key's top FIRST_BITS bits, then 11 and 10 (WIDE_BINS bins each pass), over at
# most CAND_MAX candidates after the first pass
FIRST_BITS = 11
WIDE_BINS = 2048
CAND_MAX = 2048

MAX_SPLITS = 16


def topk_splits(num_tokens: int, num_sms: int) -> int:
    """CTAs per row: the largest power of two <= 16 that keeps rows x CTAs within the SM count; 1 (the one-CTA
    kernel) once the rows alone fill the GPU. One CTA per row left 131 of 132 SMs idle at batch 1 and read a
    64K-column row five times from one SM (~86 us at 256K context on the H100, 2026-11-23)."""
    s = 1
    while s * 2 <= MAX_SPLITS and num_tokens * s * 2 <= num_sms:
        s *= 2
    return s


def order_key(T, x) -> Any:
    """The order-preserving uint32 key of fp32 x (TileLang expression): larger x, larger key."""
    bits = T.reinterpret(x, "uint32")
    return T.if_then_else(x < 0, ~bits, bits | T.Cast("uint32", 0x80000000))


# The split kernel's workspace, int32 [T, ROW_WS] (ws): all zeros before the first launch, and every launch leaves
# it all zeros again (the last of a row's CTAs to leave clears what the row used), so no memset runs before each
# launch (a graph memset node was ~1.8 us of a 64K x 8 indexer step, H100, 2026-11-24). Per row:
WS_G0 = 0                                  # resident slices: the row's histogram of the keys' top FIRST_BITS bits
WS_G1 = WS_G0 + WIDE_BINS + 1              # ... of bits 10..20 within the threshold bin (heavy-tie branch)
WS_G2 = WS_G1 + WIDE_BINS + 1              # ... of bits 0..9 (heavy-tie branch)
WS_SH = WS_G2 + WIDE_BINS + 1              # streamed rows: PASSES histograms of RADIX + 1 bins
WS_CNT = WS_SH + PASSES * (RADIX + 1)      # counters: 0 keys placed above the threshold class, 1 ties / candidates,
CNT_ABOVE, CNT_TIES, CNT_ARRIVE, CNT_LEFT = 0, 1, 2, 3  # 2 row-barrier arrivals, 3 CTAs that have left
WS_CC = WS_CNT + 8                         # resident slices: the threshold bin's columns (CAND_MAX)
WS_CK = WS_CC + CAND_MAX                   # ... and their keys
ROW_WS = WS_CK + CAND_MAX
