"""What multiplying in fp8 would cost sparse MLA decode in accuracy: the per-token error against float64 of the
decode math run with Q and / or P as e4m3 operands, on the attention GPU cases' own inputs. CPU only (an emulation
in float32 of what the MMAs would compute), so it runs anywhere in seconds.

The fp8_ds_mla cache stores K = V's 448 NoPE dims as e4m3 with a power-of-two (UE8M0) scale per 64 dims. A kernel
that multiplies those bytes as they are (fp8 mma.sync m16n8k32, the same instruction on Hopper and SM12x) needs its
other operand in e4m3 too: Q for the scores, P (with V's per-row scale folded in) for P.V. Operand forms:

  bf16        what the kernels multiply today (the cache dequantized to bf16, Q and P bf16)
  e4m3        one e4m3 term at a power-of-two scale per (head, 64 dims) for Q, per (head, 64 dims, tile) for P
  e4m3 x2     two e4m3 terms at that one scale: the value rounded, then its residual (twice the MMAs; one
              accumulator, as both terms share the scale)

The scores sum each 64-dim group's fp32 partial times its scales; the RoPE dims stay bf16 x bf16; the online softmax
is the kernels' (fp32, per tile of candidates). Columns: the worst per-token error over the cases' tokens
(||got - want|| / ||want||, the GPU cases' measure; their tolerance is attention's TOLERANCE).

    python benchmarks/attention/fp8_operand_error.py --out bench_out/fp8_operand_error.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from dsv4_jit.kernels.attention import reference
from dsv4_jit.kernels.attention.family import TOLERANCE
from dsv4_jit.model_config import load_model_config

FP8_MAX = reference.FP8_MAX
FORMS = {"bf16": 0, "e4m3": 1, "e4m3 x2": 2}
# (Q form, P form): the rows of the table
PAIRS = (("bf16", "bf16"), ("e4m3", "bf16"), ("e4m3 x2", "bf16"), ("bf16", "e4m3"), ("bf16", "e4m3 x2"),
         ("e4m3", "e4m3"), ("e4m3 x2", "e4m3 x2"))
# the attention GPU cases' decode points (TP 1): (compress ratio, context)
POINTS = ((4, 65536), (128, 8192), (128, 262144))


def as_e4m3(x: torch.Tensor, dim: int, terms: int) -> torch.Tensor:
    """x as the sum of `terms` e4m3 values at one power-of-two scale per slice along dim (0 terms: bf16)."""
    if terms == 0:
        return x.to(torch.bfloat16).float()
    amax = x.abs().amax(dim, keepdim=True).clamp_min(1e-30)
    scale = torch.exp2(torch.ceil(torch.log2(amax / FP8_MAX)))
    rest, got = x / scale, torch.zeros_like(x)
    for _ in range(terms):
        term = rest.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float()
        got, rest = got + term, rest - term
    return got * scale


def candidates(inp: dict, t: int, parts: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token t's valid candidates of both lists, concatenated: (e4m3 NoPE, scales, RoPE)."""
    out = []
    for key in ("1", "2"):
        if "idx" + key not in inp:
            continue
        idx, n = inp["idx" + key][t], int(inp["len" + key][t])
        nope, sc, rope = parts[key]
        ids = idx[:n]
        ids = ids[(ids >= 0) & (ids < nope.shape[0])].long()
        out.append((nope[ids], sc[ids], rope[ids]))
    return tuple(torch.cat([o[i] for o in out]) for i in range(3))


def token_error(q: torch.Tensor, sink: torch.Tensor, kv: tuple, scale: float, q_terms: int, p_terms: int,
                tile: int) -> float:
    """One token's [H, 512] output with the given operand forms against float64: ||got - want|| / ||want||."""
    nope, sc, rope = kv
    n, h = nope.shape[0], q.shape[0]
    full = torch.cat([(nope * sc[..., None]).reshape(n, -1), rope], 1).double()
    s = q.double() @ full.T * scale
    m = torch.maximum(s.amax(-1) if n else torch.full((h,), -torch.inf, dtype=torch.float64), sink.double())
    p = torch.exp(s - m[:, None])
    want = p @ full / (p.sum(-1) + torch.exp(sink.double() - m))[:, None]
    qn = as_e4m3(q[:, :reference.NOPE].float().view(h, 7, 64), -1, q_terms)
    acc = torch.zeros(h, reference.D)
    run_max, run_sum = torch.full((h,), -torch.inf), torch.zeros(h)
    for a in range(0, n, tile):
        k8, ks, kr = nope[a:a + tile], sc[a:a + tile], rope[a:a + tile]
        st = (torch.einsum("hgd,ngd->hng", qn, k8) * ks[None]).sum(-1)
        st = (st + q[:, reference.NOPE:].float() @ kr.T) * scale
        new_max = torch.maximum(run_max, st.amax(-1))
        alpha, pt = torch.exp(run_max - new_max), torch.exp(st - new_max[:, None])
        run_sum, run_max = run_sum * alpha + pt.sum(-1), new_max
        acc *= alpha[:, None]
        for g in range(7):   # V's scale folded into P per (candidate, group), then P in the operand form
            pg = as_e4m3(pt * ks[None, :, g], -1, p_terms)
            acc[:, g * 64:(g + 1) * 64] += pg @ k8[:, g]
        acc[:, reference.NOPE:] += pt.to(torch.bfloat16).float() @ kr
    fin = torch.maximum(run_max, sink)
    keep = torch.exp(run_max - fin)
    got = acc * keep[:, None] / (run_sum * keep + torch.exp(sink - fin))[:, None]
    return float((got.double() - want).norm() / want.norm().clamp_min(1e-30))


def measure(model: str, tokens: int, tile: int, seed: int) -> list[dict]:
    from dsv4_jit.kernels.attention import family
    m = load_model_config(model)
    cases = {c.name: c for c in family.FAMILY.gpu_cases(m)}
    rows = []
    for ratio, ctx in POINTS:
        label = f"{ctx // 1024}K"
        case = cases[f"sparse_mla_decode[tp=1,ratio={ratio},ctx={label}]"]
        inp = case.make_inputs(tokens, "cpu", torch.Generator().manual_seed(seed))
        parts = {"1": reference.split_fp8_ds_mla(inp["cache1"], family.SWA_BLOCK)}
        if "cache2" in inp:
            parts["2"] = reference.split_fp8_ds_mla(inp["cache2"], family.COMP_BLOCK)
        kvs = [candidates(inp, t, parts) for t in range(tokens)]
        for qf, pf in PAIRS:
            err = max(token_error(inp["q"][t], inp["sink"], kvs[t], m.head_dim ** -0.5, FORMS[qf], FORMS[pf], tile)
                      for t in range(tokens) if kvs[t][0].shape[0])
            rows.append({"model": model, "ratio": ratio, "ctx": ctx, "tokens": tokens, "tile": tile, "q": qf,
                         "p": pf, "worst_token_error": err, "tolerance": TOLERANCE})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="deepseek-v4-flash")
    ap.add_argument("--tokens", type=int, default=8, help="decode tokens of each GPU case point (1, 8, 64, ...)")
    ap.add_argument("--tile", type=int, default=16, help="candidates a tile (P's e4m3 scale spans one tile)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    rows = measure(a.model, a.tokens, a.tile, a.seed)
    print(f"worst per-token error against float64 ({a.model}, {a.tokens} tokens, {a.tile}-candidate tiles; "
          f"tolerance {TOLERANCE:.0e})")
    print("| ratio | ctx | Q | P | error |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['ratio']} | {r['ctx']:,} | {r['q']} | {r['p']} | {r['worst_token_error']:.2e} |")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"command": " ".join(["python3"] + sys.argv), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
