"""The sparse MLA attention family: decode over the fp8_ds_mla paged cache (SWA window + compressed
candidates, MTP, split-KV + combine) and ragged prefill over gathered bf16 KV, both with the sink.

Kernels: decode.py, prefill.py, combine.py (common.py: what they share); specs and select: sparse_mla.py.
Host ops: ops.py. Reference and the cache codec: reference.py.
"""
from __future__ import annotations

import math

from dsv4_jit.family import GpuCase, KernelFamily, KernelUse, register_family
from dsv4_jit.spec import get_spec

from . import sparse_mla

# bf16 output (2^-9 per element) after bf16 probabilities in the PV product: ~3e-3 per token measured.
TOLERANCE = 1e-2

# decode token counts = batch x (1 + MTP draft tokens): batch {1, 8, 64} x MTP {0, 1, 2}
_BATCH_MTP = {b * (1 + k): (b, k) for b in (1, 8, 64) for k in (0, 1, 2)}
DECODE_TOKENS = tuple(sorted(_BATCH_MTP))
PREFILL_TOKENS = (1, 7, 64, 300, 1000, 2049)
SWA_BLOCK, SWA_RING, COMP_BLOCK = 64, 256, 64


def _uses(model, parallel) -> list[KernelUse]:
    """Every layer runs the same attention statics (heads per rank, scale); ratio 0/4/128 layers differ
    only in their candidate lists, which are run-time lengths."""
    fwd, comb = get_spec("sparse_mla_fwd"), get_spec("sparse_mla_combine")
    dec = fwd.static_params(model, parallel)
    pre = dict(dec, kv_format="bf16")
    return [KernelUse(fwd, dec, "sparse MLA over the fp8_ds_mla cache (decode / MTP, every layer)"),
            KernelUse(comb, dec, "split-KV combine + sink (small decode batches)"),
            KernelUse(fwd, pre, "sparse MLA over gathered bf16 KV (prefill)"),
            KernelUse(comb, pre, "split-KV combine + sink (short prefill chunks)")]


# ---------------------------------------------------------------------------------------------
# GPU cases
# ---------------------------------------------------------------------------------------------
def _request_lengths(batch: int, ctx: int, g) -> list[int]:
    """The first request at the full context, the rest spread below it, a few shorter than the window."""
    import torch
    out = [ctx]
    for i in range(1, batch):
        if i % 5 == 1:
            out.append(int(torch.randint(1, 100, (1,), generator=g)))
        else:
            out.append(int(torch.randint(max(1, ctx // 8), ctx + 1, (1,), generator=g)))
    return out


def _holes(idx, lens, g, frac: float = 0.03):
    """Punch -1 holes inside the lengths and put garbage (never read) past them."""
    import torch
    n = idx.shape[1]
    live = torch.arange(n)[None, :] < lens[:, None]
    hole = torch.rand(idx.shape, generator=g) < frac
    junk = torch.randint(-(2 ** 30), 2 ** 30, idx.shape, generator=g, dtype=torch.int32)
    return torch.where(live, torch.where(hole, torch.full_like(idx, -1), idx), junk)


def _kv_rows(n: int, g):
    import torch
    scale = torch.exp(torch.rand(n, 1, generator=g) * 2 - 1)
    return torch.randn(n, sparse_mla.D, generator=g) * scale


def _decode_inputs(m, tp: int, ratio: int, ctx: int, t: int, device, g) -> dict:
    """batch x (1+MTP) query tokens; a paged SWA ring per request and a shared compressed pool that each
    request maps through its own random page table."""
    import torch
    from . import reference
    heads = m.num_attention_heads // tp
    batch, mtp = _BATCH_MTP[t]
    w, topk = m.sliding_window, m.index_topk
    ctxs = _request_lengths(batch, ctx, g)
    # token k of request r sits at position L_r - 1 - (mtp - k)
    pos = [max(0, c - 1 - (mtp - k)) for c in ctxs for k in range(mtp + 1)]
    req = [r for r in range(batch) for _ in range(mtp + 1)]

    ring_pages = SWA_RING // SWA_BLOCK
    p1 = batch * ring_pages + 3
    pt1 = torch.randperm(p1, generator=g)[: batch * ring_pages].view(batch, ring_pages)
    idx1 = torch.full((t, w), -1, dtype=torch.int32)
    len1 = torch.zeros(t, dtype=torch.int32)
    for i, (r, p) in enumerate(zip(req, pos)):
        n = min(w, p + 1)
        ps = torch.arange(p - n + 1, p + 1) % SWA_RING
        idx1[i, :n] = (pt1[r, ps // SWA_BLOCK] * SWA_BLOCK + ps % SWA_BLOCK).int()
        len1[i] = n
    d = {"q": None, "idx1": _holes(idx1, len1, g), "len1": len1}
    pb1 = reference.page_bytes_for(SWA_BLOCK)
    fill1 = torch.randint(0, 256, (p1 * pb1,), generator=g, dtype=torch.uint8)
    d["cache1"] = reference.pack_fp8_ds_mla(_kv_rows(p1 * SWA_BLOCK, g), torch.arange(p1 * SWA_BLOCK), p1,
                                            SWA_BLOCK, fill=fill1)
    if ratio:
        avail_max = max(1, ctx // ratio)
        n2 = min(topk, avail_max) if ratio == 4 else avail_max
        p2 = math.ceil(avail_max / COMP_BLOCK) + 4
        pts = torch.stack([torch.randperm(p2, generator=g) for _ in range(batch)])
        idx2 = torch.full((t, n2), -1, dtype=torch.int32)
        len2 = torch.zeros(t, dtype=torch.int32)
        for i, (r, p) in enumerate(zip(req, pos)):
            avail = (p + 1) // ratio
            c = torch.randperm(avail, generator=g)[: min(topk, avail)] if ratio == 4 else torch.arange(avail)
            idx2[i, : c.numel()] = (pts[r, c // COMP_BLOCK] * COMP_BLOCK + c % COMP_BLOCK).int()
            len2[i] = c.numel()
        d.update(idx2=_holes(idx2, len2, g), len2=len2)
        fill2 = torch.randint(0, 256, (p2 * reference.page_bytes_for(COMP_BLOCK),), generator=g, dtype=torch.uint8)
        d["cache2"] = reference.pack_fp8_ds_mla(_kv_rows(p2 * COMP_BLOCK, g), torch.arange(p2 * COMP_BLOCK), p2,
                                                COMP_BLOCK, fill=fill2)
    qs = torch.exp(torch.rand(t, 1, 1, generator=g) * 2.5 - 1)
    d["q"] = (torch.randn(t, heads, sparse_mla.D, generator=g) * qs).to(torch.bfloat16)
    d["sink"] = torch.randn(heads, generator=g) * 2
    return {k: v.to(device) for k, v in d.items()}


def _vllm_view(cache, block: int):
    """A packed cache as vLLM 0.33 binds it: [pages, block, 584] over each page's bytes at the page's stride (the
    page rounded up to 576 B), so dim 0 is not contiguous (64 x 584 = 37,376 B at a 37,440 B stride)."""
    row = sparse_mla.TOKEN_BYTES + sparse_mla.SCALE_BYTES
    return cache.as_strided((cache.shape[0], block, row), (cache.stride(0), row, 1))


def _decode_case(m, tp: int, ratio: int, ctx: int, vllm_pages: bool = False) -> GpuCase:
    """One decode step; vllm_pages: both caches passed as vLLM 0.33 binds them (_vllm_view), the reference reading
    the packed buffers."""
    import torch
    from . import ops, reference
    view = _vllm_view if vllm_pages else (lambda c, b: c)

    def make_outputs(inp, arch):
        q = inp["q"]
        return {"out": torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)}

    def launch(inp, out, arch, get_kernel):
        extra = {}
        if "cache2" in inp:
            extra = dict(extra_kv_cache=view(inp["cache2"], COMP_BLOCK), extra_indices=inp["idx2"],
                         extra_lengths=inp["len2"], extra_block_size=COMP_BLOCK)
        ops.sparse_mla_decode(inp["q"], view(inp["cache1"], SWA_BLOCK), inp["idx1"], inp["len1"], inp["sink"],
                              block_size=SWA_BLOCK,
                              softmax_scale=m.head_dim ** -0.5, out=out["out"], arch=arch, get_kernel=get_kernel,
                              **extra)

    def ref(inp, out):
        rows1 = reference.unpack_fp8_ds_mla(inp["cache1"], SWA_BLOCK)
        rows2 = reference.unpack_fp8_ds_mla(inp["cache2"], COMP_BLOCK) if "cache2" in inp else None
        return {"out": reference.ref_sparse_mla(inp["q"], rows1, inp["idx1"], inp["len1"], rows2, inp.get("idx2"),
                                                inp.get("len2"), inp["sink"], m.head_dim ** -0.5)}

    label = f"{ctx // 1024}K" if ctx >= 1024 else str(ctx)
    return GpuCase(f"sparse_mla_decode[tp={tp},ratio={ratio},ctx={label}{',vllm_pages' if vllm_pages else ''}]",
                   lambda t, dev, g: _decode_inputs(m, tp, ratio, ctx, t, dev, g), make_outputs, launch, ref,
                   {"out": TOLERANCE}, tokens=DECODE_TOKENS, tp_size=tp, fixes={"kv_format": "fp8_ds_mla"})


def _prefill_case(m, tp: int, ctx: int) -> GpuCase:
    """One request's prefill chunk of T tokens ending at `ctx`: its SWA window over the gathered rows of the
    sequence and up to index_topk compressed (ratio 4) rows, holes included."""
    import torch
    from . import ops, reference
    heads = m.num_attention_heads // tp

    def make_inputs(t, device, g):
        w, topk = m.sliding_window, m.index_topk
        p0 = max(0, ctx - t)
        n_rows = p0 + t
        comp = max(1, n_rows // 4)
        idx1 = torch.full((t, w), -1, dtype=torch.int32)
        len1 = torch.zeros(t, dtype=torch.int32)
        idx2 = torch.full((t, min(topk, comp)), -1, dtype=torch.int32)
        len2 = torch.zeros(t, dtype=torch.int32)
        for i in range(t):
            p = p0 + i
            n = min(w, p + 1)
            idx1[i, :n] = torch.arange(p - n + 1, p + 1, dtype=torch.int32)
            len1[i] = n
            avail = (p + 1) // 4
            c = torch.randperm(avail, generator=g)[: min(topk, avail)]
            idx2[i, : c.numel()] = c.int()
            len2[i] = c.numel()
        qs = torch.exp(torch.rand(t, 1, 1, generator=g) * 2.5 - 1)
        d = {"q": (torch.randn(t, heads, sparse_mla.D, generator=g) * qs).to(torch.bfloat16),
             "kv1": _kv_rows(n_rows, g).to(torch.bfloat16), "idx1": _holes(idx1, len1, g), "len1": len1,
             "kv2": _kv_rows(comp, g).to(torch.bfloat16), "idx2": _holes(idx2, len2, g), "len2": len2,
             "sink": torch.randn(heads, generator=g) * 2}
        return {k: v.to(device) for k, v in d.items()}

    def make_outputs(inp, arch):
        q = inp["q"]
        return {"out": torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)}

    def launch(inp, out, arch, get_kernel):
        ops.sparse_mla_prefill(inp["q"], inp["kv1"], inp["idx1"], inp["len1"], inp["sink"], extra_kv=inp["kv2"],
                               extra_indices=inp["idx2"], extra_lengths=inp["len2"], softmax_scale=m.head_dim ** -0.5,
                               out=out["out"], arch=arch, get_kernel=get_kernel)

    def ref(inp, out):
        return {"out": reference.ref_sparse_mla(inp["q"], inp["kv1"].float(), inp["idx1"], inp["len1"],
                                                inp["kv2"].float(), inp["idx2"], inp["len2"], inp["sink"],
                                                m.head_dim ** -0.5)}

    return GpuCase(f"sparse_mla_prefill[tp={tp},ctx={ctx // 1024}K]", make_inputs, make_outputs, launch, ref,
                   {"out": TOLERANCE}, tokens=PREFILL_TOKENS, tp_size=tp, fixes={"kv_format": "bf16"})


def _empty_rows_case(m) -> GpuCase:
    """64 heads a rank, the sink at -1e4 for every head, and a third of the tokens with no candidate (length 0 in
    both lists), a third whose candidates are all holes (-1): those rows must be 0, split (T = 1, 8) or not
    (T = 80), where e^sink underflows the denominator."""
    import torch
    from . import ops, reference
    tp = max(1, m.num_attention_heads // 64)
    heads = m.num_attention_heads // tp

    def make_inputs(t, device, g):
        w, n2 = m.sliding_window, m.index_topk
        p1, p2 = 4, 16
        idx1 = torch.randint(0, p1 * SWA_BLOCK, (t, w), generator=g, dtype=torch.int32)
        idx2 = torch.randint(0, p2 * COMP_BLOCK, (t, n2), generator=g, dtype=torch.int32)
        len1 = torch.randint(1, w + 1, (t,), generator=g, dtype=torch.int32)
        len2 = torch.randint(1, n2 + 1, (t,), generator=g, dtype=torch.int32)
        kind = torch.arange(t) % 3
        len1[kind == 0], len2[kind == 0] = 0, 0
        idx1[kind == 1], idx2[kind == 1] = -1, -1
        d = {"q": (torch.randn(t, heads, sparse_mla.D, generator=g) * 3).to(torch.bfloat16),
             "idx1": idx1, "len1": len1, "idx2": idx2, "len2": len2,
             "sink": torch.full((heads,), -1e4),
             "cache1": reference.pack_fp8_ds_mla(_kv_rows(p1 * SWA_BLOCK, g), torch.arange(p1 * SWA_BLOCK), p1,
                                                 SWA_BLOCK),
             "cache2": reference.pack_fp8_ds_mla(_kv_rows(p2 * COMP_BLOCK, g), torch.arange(p2 * COMP_BLOCK), p2,
                                                 COMP_BLOCK)}
        return {k: v.to(device) for k, v in d.items()}

    def make_outputs(inp, arch):
        return {"out": torch.empty(inp["q"].shape, dtype=torch.bfloat16, device=inp["q"].device)}

    def launch(inp, out, arch, get_kernel):
        ops.sparse_mla_decode(inp["q"], inp["cache1"], inp["idx1"], inp["len1"], inp["sink"], block_size=SWA_BLOCK,
                              extra_kv_cache=inp["cache2"], extra_indices=inp["idx2"], extra_lengths=inp["len2"],
                              extra_block_size=COMP_BLOCK, softmax_scale=m.head_dim ** -0.5, out=out["out"],
                              arch=arch, get_kernel=get_kernel)

    def ref(inp, out):
        return {"out": reference.ref_sparse_mla(inp["q"], reference.unpack_fp8_ds_mla(inp["cache1"], SWA_BLOCK),
                                                inp["idx1"], inp["len1"],
                                                reference.unpack_fp8_ds_mla(inp["cache2"], COMP_BLOCK), inp["idx2"],
                                                inp["len2"], inp["sink"], m.head_dim ** -0.5)}

    return GpuCase(f"sparse_mla_decode[tp={tp},empty_rows,sink=-1e4]", make_inputs, make_outputs, launch, ref,
                   {"out": TOLERANCE}, tokens=(1, 8, 80), tp_size=tp, fixes={"kv_format": "fp8_ds_mla"})


def _tps(m) -> tuple[int, ...]:
    """TP 1, 2, 4: V4-Flash's 64 heads run as 64, 32 and 16 per rank, V4-Pro's 128 as 128, 64, 32."""
    return tuple(tp for tp in (1, 2, 4) if m.num_attention_heads % tp == 0)


def _gpu_cases(m) -> list[GpuCase]:
    cases = []
    for tp in _tps(m):
        cases += [_decode_case(m, tp, 0, 1024), _decode_case(m, tp, 4, 1024), _decode_case(m, tp, 128, 8192),
                  _decode_case(m, tp, 4, 65536), _decode_case(m, tp, 128, 262144)]
        cases.append(_prefill_case(m, tp, 8192))
    cases.append(_empty_rows_case(m))
    cases.append(_decode_case(m, 1, 4, 65536, vllm_pages=True))
    return cases


def _check_source(variant, src: str) -> None:
    """Programmatic dependent launch where the params say: both kernels wait for their producer's grid; the forward
    kernel lets the kernel behind it launch in its epilogue, the combine at its start up to a few tokens (pdl)."""
    trigger = "cudaTriggerProgrammaticLaunchCompletion"
    if "cudaGridDependencySynchronize" not in src:
        raise AssertionError(f"{variant.name}: cudaGridDependencySynchronize missing")
    if (trigger in src) != variant.p.get("pdl", True):
        raise AssertionError(f"{variant.name}: {trigger} {'emitted' if trigger in src else 'missing'}")


FAMILY = register_family(KernelFamily(
    name="attention",
    specs=(get_spec("sparse_mla_fwd"), get_spec("sparse_mla_combine")),
    uses=_uses,
    gpu_cases=_gpu_cases,
    ops={"sparse_mla_decode": ("sparse_mla_fwd", "sparse_mla_combine"),
         "sparse_mla_prefill": ("sparse_mla_fwd", "sparse_mla_combine")},
    doc="sparse MLA attention with the sink: fp8_ds_mla paged decode (split-KV + combine) and bf16 prefill",
    check_source=_check_source,
))

__all__ = ["FAMILY", "sparse_mla"]
