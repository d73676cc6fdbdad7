"""The lightning-indexer family (DeepSeek V4 ratio-4 layers): paged decode logits, ragged prefill logits, top-k
with page-table translation, SWA index prep. Kernels: logits.py, topk.py, swa.py. Host ops: ops.py. References:
reference.py.

Assumptions (stated, not read from an engine):
  * Index heads are NOT split by tensor parallelism: vLLM's DeepSeek indexer replicates wq_b and weights_proj
    (ReplicatedLinear) and every rank scores all 64 heads, so TP changes no indexer static.
  * Index-K cache page = 64 compressed positions (INDEX_PAGE_SIZE; DeepGEMM's SM90 paged block_kv) and SWA
    cache page = 64 tokens (SWA_PAGE_SIZE). An engine with other page sizes needs those statics in `uses`
    (the ops accept 16..256 and select the matching variant).
  * MTP: next_n in {1, 2, 3} (0..2 draft tokens) are all planned, because `uses` does not see the engine's
    speculative config: three small decode-logits variants per arch.
"""
from __future__ import annotations

import math

from dsv4_jit.family import GpuCase, KernelFamily, KernelUse, register_family
from dsv4_jit.spec import get_spec
from dsv4_jit.testing import cuda_generator

from . import logits, swa, topk  # noqa: F401  (registers the specs)

INDEX_PAGE_SIZE = 64
SWA_PAGE_SIZE = 64
NEXT_NS = (1, 2, 3)
MAX_CONTEXT = 262_144          # tokens; 65,536 compressed positions at ratio 4
RATIO = 4

# Per-token relative error against float64: fp8 products are exact in fp32 and the kernel sums 128-term dots
# and 64 heads in fp32, so ~1e-6 is expected; index outputs are exact.
LOGITS_TOL = 1e-3


def _uses(model, parallel) -> list[KernelUse]:
    uses: list[KernelUse] = []
    if RATIO in model.layer_ratios:
        dec = get_spec("indexer_decode_logits")
        base = dec.static_params(model, parallel)
        for nn in NEXT_NS:
            uses.append(KernelUse(dec, {**base, "next_n": nn, "page_size": INDEX_PAGE_SIZE, "clean": True},
                                  f"indexer decode logits (ratio-4 layers, next_n={nn})"))
            uses.append(KernelUse(dec, {**base, "next_n": nn, "page_size": INDEX_PAGE_SIZE, "clean": False},
                                  f"indexer decode logits for its top-k, no -inf fill (ratio-4 layers, next_n={nn})"))
        pre = get_spec("indexer_prefill_logits")
        uses.append(KernelUse(pre, pre.static_params(model, parallel), "indexer prefill logits (ratio-4 layers)"))
        tk = get_spec("indexer_topk")
        uses.append(KernelUse(tk, {**tk.static_params(model, parallel), "page_size": INDEX_PAGE_SIZE},
                              "indexer top-k + page translation (ratio-4 layers)"))
        ts = get_spec("indexer_topk_split")
        uses.append(KernelUse(ts, {**ts.static_params(model, parallel), "page_size": INDEX_PAGE_SIZE},
                              "indexer top-k, rows split over CTAs (ratio-4 layers, few tokens)"))
    swa_spec = get_spec("indexer_swa_indices")
    uses.append(KernelUse(swa_spec, {**swa_spec.static_params(model, parallel), "page_size": SWA_PAGE_SIZE},
                          "SWA index prep (once per forward)"))
    return uses


# ---------------------------------------------------------------------------------------------
# GPU cases
# ---------------------------------------------------------------------------------------------
def _contexts(b: int, max_ctx: int, min_ctx: int, g) -> list[int]:
    """Request lengths in tokens: the first is max_ctx, a quarter are short (top-k rows with < 512 positions),
    the rest log-uniform in [min_ctx, max_ctx]."""
    import torch
    u = torch.rand(b, generator=g, dtype=torch.float64)
    ctx = [int(math.exp(math.log(min_ctx) + float(x) * (math.log(max_ctx) - math.log(min_ctx)))) for x in u]
    for i in range(b):
        if i % 4 == 3:
            ctx[i] = min_ctx + int(torch.randint(0, 4 * 512, (1,), generator=g))
    ctx[0] = max_ctx
    return ctx


def _paged(lengths: list[int], page_size: int, max_pages: int, g, device, spare: int = 3):
    """Block table [len(lengths), max_pages] int32 over a shuffled page pool (-1 past each length) and the
    pool size."""
    import torch
    need = [-(-n // page_size) for n in lengths]
    total = sum(need) + spare
    perm = torch.randperm(total, generator=g)
    bt = torch.full((len(lengths), max_pages), -1, dtype=torch.int32)
    at = 0
    for i, k in enumerate(need):
        bt[i, :k] = perm[at: at + k].to(torch.int32)
        at += k
    return bt.to(device), total


def _qw(t: int, heads: int, dim: int, cg, device):
    import torch
    from .reference import quantize_rows_fp8
    tok_mag = torch.exp(torch.rand(t, 1, 1, generator=cg, device=device) * 4 - 2)
    q = torch.randn(t, heads, dim, generator=cg, device=device) * tok_mag
    q8, qs = quantize_rows_fp8(q.reshape(t, heads * dim))
    w = torch.randn(t, heads, generator=cg, device=device) * (heads ** -0.5) * (dim ** -0.5)
    return q8.reshape(t, heads, dim), qs, w.float()


def _k_rows(n: int, dim: int, cg, device):
    import torch
    from .reference import quantize_rows_fp8
    k = torch.randn(n, dim, generator=cg, device=device) * torch.exp(torch.rand(n, 1, generator=cg, device=device) * 2 - 1)
    return quantize_rows_fp8(k)


def _decode_inputs(m, next_n: int, t: int, device, g, max_ctx: int = MAX_CONTEXT) -> dict:
    import torch
    from .reference import pack_paged_cache
    b = max(1, t // next_n)
    cg = cuda_generator(g, device)
    ctx = _contexts(b, max_ctx, next_n, g)
    comp = [c // RATIO for c in ctx]
    width = max_ctx // RATIO + 37                       # not a multiple of any tile: partial last chunk
    max_pages = -(-width // INDEX_PAGE_SIZE) + 1
    bt, pages = _paged(comp, INDEX_PAGE_SIZE, max_pages, g, device)
    k8, ks = _k_rows(pages * INDEX_PAGE_SIZE, m.index_head_dim, cg, device)
    q8, qs, w = _qw(b * next_n, m.index_n_heads, m.index_head_dim, cg, device)
    return {"q": q8, "q_scale": qs, "weights": w, "kv_cache": pack_paged_cache(k8, ks, INDEX_PAGE_SIZE),
            "seq_lens": torch.tensor(ctx, dtype=torch.int32, device=device), "block_table": bt, "width": width}


VLLM_PAGE_ALIGN = 576   # vLLM 0.33 rounds an index-K page up to a multiple of this (fp8_ds_mla)


def _vllm_pages(d: dict, g, four_d: bool) -> dict:
    """The cache as vLLM 0.33 lays it out: each page's [P*D fp8 | P fp32 scales] at the start of a stride rounded
    up to a multiple of 576 B (64 x 132 = 8,448 -> 8,640 B), garbage in the padding; as the 2-D buffer, or a
    [pages, P, 1, D + 4] view of its pages. The compact cache stays for the reference."""
    import torch
    compact = d["kv_cache"]
    pages, page_bytes = compact.shape
    stride = -(-page_bytes // VLLM_PAGE_ALIGN) * VLLM_PAGE_ALIGN
    buf = torch.randint(0, 256, (pages, stride), generator=g, dtype=torch.uint8).to(compact.device)
    buf[:, :page_bytes] = compact
    cache = buf[:, :page_bytes].unflatten(1, (INDEX_PAGE_SIZE, 1, page_bytes // INDEX_PAGE_SIZE)) if four_d else buf
    return {**d, "kv_cache": cache, "kv_ref": compact}


def _f64_of_int(x, poison: int):
    import torch
    y = x.double()
    return torch.where(x == poison, torch.full_like(y, float("nan")), y)


POISON = -(2**31)


def _logits_outputs(inp, arch):
    import torch
    t, w = inp["q"].shape[0], inp["width"]
    dev = inp["q"].device
    return {"logits": torch.empty(t, w, dtype=torch.float64, device=dev),
            "masked": torch.empty(t, w, dtype=torch.float64, device=dev),
            "row_info": torch.empty(t, 3, dtype=torch.float64, device=dev)}


def _store_logits(out, lg, info):
    """Kernel outputs (NaN / POISON where unwritten) into the harness's float64 outputs: -inf becomes 0 in
    `logits` and 1 in `masked`, so the per-token relative error sees finite numbers."""
    import torch
    ninf = torch.isneginf(lg)
    out["logits"].copy_(torch.where(ninf, torch.zeros_like(lg), lg).double())
    out["masked"].copy_(ninf.double())
    out["row_info"].copy_(_f64_of_int(info, POISON))


def _logits_ref(lg, info) -> dict:
    import torch
    inf = torch.isinf(lg)
    return {"logits": torch.where(inf, torch.zeros_like(lg), lg), "masked": inf.double(), "row_info": info.double()}


def _decode_logits_case(m, next_n: int, vllm_pages: str = "") -> GpuCase:
    """vllm_pages "2d" / "4d": the cache in vLLM 0.33's padded page layout (_vllm_pages)."""
    import torch
    from . import ops, reference

    def make_inputs(t, d, g):
        inp = _decode_inputs(m, next_n, t, d, g)
        return _vllm_pages(inp, g, vllm_pages == "4d") if vllm_pages else inp

    def launch(inp, out, arch, get_kernel):
        t, w = inp["q"].shape[0], inp["width"]
        lg = torch.full((t, w), float("nan"), dtype=torch.float32, device=inp["q"].device)
        info = torch.full((t, 3), POISON, dtype=torch.int32, device=inp["q"].device)
        ops.indexer_decode_logits(inp["q"], inp["q_scale"], inp["weights"], inp["kv_cache"], inp["seq_lens"],
                                  inp["block_table"], next_n=next_n, arch=arch, get_kernel=get_kernel, out=lg,
                                  row_info=info)
        _store_logits(out, lg, info)

    def ref(inp, out):
        lg, info = reference.ref_decode_logits(inp["q"], inp["q_scale"], inp["weights"],
                                               inp.get("kv_ref", inp["kv_cache"]), inp["seq_lens"],
                                               inp["block_table"], next_n, inp["width"], RATIO)
        return _logits_ref(lg, info)

    layout = f",vllm_pages={vllm_pages}" if vllm_pages else ""
    return GpuCase(f"indexer_decode_logits[next_n={next_n}{layout}]", make_inputs, _logits_outputs, launch, ref,
                   {"logits": LOGITS_TOL, "masked": 0.0, "row_info": 0.0}, tokens=tuple(b * next_n for b in (1, 8, 64)),
                   fixes={"next_n": next_n})


def _topk_check(inp, got, lg, info) -> dict:
    from . import reference
    want = reference.check_topk_sets(got, lg, info, inp["block_table"], inp["topk"], inp["page_size"])
    lo = info[:, 0].clamp(0, lg.shape[1])
    hi = info[:, 1].clamp(max=lg.shape[1])
    n = (hi - lo).clamp(min=0).clamp(max=inp["topk"])
    return {"indices": want.double(), "lengths": n.double()}


def _topk_outputs(inp, arch):
    import torch
    t = inp["row_info"].shape[0] if "row_info" in inp else inp["q"].shape[0]
    dev = inp["block_table"].device
    return {"indices": torch.empty(t, inp["topk"], dtype=torch.float64, device=dev),
            "lengths": torch.empty(t, dtype=torch.float64, device=dev)}


def _decode_topk_case(m, next_n: int, vllm_pages: bool = False) -> GpuCase:
    import torch
    from . import ops

    def make_inputs(t, device, g):
        d = _decode_inputs(m, next_n, t, device, g)
        if vllm_pages:
            d = _vllm_pages(d, g, False)
        d.update(topk=m.index_topk, page_size=INDEX_PAGE_SIZE)
        # the second request's logits all 0: a row of equal keys (the split top-k's heavy-tie branch, on the
        # kernel's own logits)
        d["weights"][next_n: 2 * next_n] = 0
        return d

    def launch(inp, out, arch, get_kernel):
        t, w, dev = inp["q"].shape[0], inp["width"], inp["q"].device
        # +inf everywhere first: the logits behind this top-k leave columns past a group's tiles unwritten
        # (clean=False), and a top-k that read one would take it
        ws = (torch.full((t, w), float("inf"), dtype=torch.float32, device=dev),
              torch.empty(t, 3, dtype=torch.int32, device=dev))
        res = (torch.full((t, inp["topk"]), POISON, dtype=torch.int32, device=dev),
               torch.full((t,), POISON, dtype=torch.int32, device=dev))
        ops.indexer_decode_topk(inp["q"], inp["q_scale"], inp["weights"], inp["kv_cache"], inp["seq_lens"],
                                inp["block_table"], next_n=next_n, topk=inp["topk"], arch=arch,
                                get_kernel=get_kernel, workspace=ws, out=res)
        inp["_logits"], inp["_row_info"] = ws      # the kernel's own logits: top-k is checked against them
        out["indices"].copy_(_f64_of_int(res[0], POISON))
        out["lengths"].copy_(_f64_of_int(res[1], POISON))

    def ref(inp, out):
        got = out["indices"].nan_to_num(-2).long()
        return _topk_check(inp, got, inp["_logits"], inp["_row_info"].long())

    layout = ",vllm_pages=2d" if vllm_pages else ""
    return GpuCase(f"indexer_decode_topk[next_n={next_n}{layout}]", make_inputs, _topk_outputs, launch, ref,
                   {"indices": 0.0, "lengths": 0.0}, tokens=tuple(b * next_n for b in (1, 8, 64)),
                   fixes={"next_n": next_n})


def _prefill_inputs(m, t: int, device, g) -> dict:
    import torch
    cg = cuda_generator(g, device)
    r = min(t, 4)
    max_ctx = 65_536 if t <= 100 else 16_384
    ctx = _contexts(r, max_ctx, 1, g)
    share = [t // r + (1 if i < t % r else 0) for i in range(r)]
    ctx = [max(c, s) for c, s in zip(ctx, share)]
    comp = [c // RATIO for c in ctx]
    offs = [0]
    for c in comp:
        offs.append(offs[-1] + c)
    num_k = max(offs[-1], 1)
    ks, ke, req = [], [], []
    for i, (c, s) in enumerate(zip(ctx, share)):
        for p in range(c - s, c):             # the chunk is the request's last s tokens
            ks.append(offs[i])
            ke.append(offs[i] + (p + 1) // RATIO)
            req.append(i)
    k8, kscale = _k_rows(num_k, m.index_head_dim, cg, device)
    q8, qs, w = _qw(t, m.index_n_heads, m.index_head_dim, cg, device)
    i32 = lambda v: torch.tensor(v, dtype=torch.int32, device=device)  # noqa: E731
    return {"q": q8, "q_scale": qs, "weights": w, "k": k8, "k_scale": kscale, "ks": i32(ks), "ke": i32(ke),
            "req_idx": i32(req), "width": num_k + 5}


def _prefill_logits_case(m) -> GpuCase:
    import torch
    from . import ops, reference

    def launch(inp, out, arch, get_kernel):
        t, w, dev = inp["q"].shape[0], inp["width"], inp["q"].device
        lg = torch.full((t, w), float("nan"), dtype=torch.float32, device=dev)
        info = torch.full((t, 3), POISON, dtype=torch.int32, device=dev)
        ops.indexer_prefill_logits(inp["q"], inp["q_scale"], inp["weights"], inp["k"], inp["k_scale"], inp["ks"],
                                   inp["ke"], inp["req_idx"], arch=arch, get_kernel=get_kernel, out=lg, row_info=info)
        _store_logits(out, lg, info)

    def ref(inp, out):
        lg, info = reference.ref_prefill_logits(inp["q"], inp["q_scale"], inp["weights"], inp["k"], inp["k_scale"],
                                                inp["ks"], inp["ke"], inp["req_idx"], inp["width"])
        return _logits_ref(lg, info)

    return GpuCase("indexer_prefill_logits", lambda t, d, g: _prefill_inputs(m, t, d, g), _logits_outputs, launch,
                   ref, {"logits": LOGITS_TOL, "masked": 0.0, "row_info": 0.0}, tokens=(1, 7, 100, 1000, 2049))


def _topk_inputs(m, t: int, device, g) -> dict:
    """Rows as the logits kernels leave them: short rows (< topk), exactly topk, topk + 1, long rows; some
    rows start past column 0 (prefill); some rows full of ties; -1 pages past each row's length. Up to 100
    rows, rows of 7,000 columns are selected from shared memory by both kernels on both schedules (split:
    <= SPLIT_RESIDENT_MAX) and rows of 65,613 by none, so both paths of both kernels run; row 4 (T 5-100) is
    20,000 equal values: the split kernel's resident slices with a threshold bin over CAND_MAX keys."""
    import torch
    k = m.index_topk
    width = (65_536 if t <= 100 else 4_096) + 77
    cg = cuda_generator(g, device)
    lens, starts = [], []
    for i in range(t):
        kind = i % 6
        n = {0: width, 1: int(torch.randint(1, k, (1,), generator=g)), 2: k, 3: k + 1,
             4: int(torch.randint(k, width, (1,), generator=g)), 5: min(width // 3, 7_000)}[kind]
        if i == 4 and t <= 100:
            n = 20_000  # made all ties below: split slices whose threshold bin overflows the candidate list
        lo = int(torch.randint(0, width - n + 1, (1,), generator=g)) if kind == 4 else 0
        lens.append(n)
        starts.append(lo)
    lg = torch.randn(t, width, generator=cg, device=device)
    lg[1::5] = (lg[1::5] * 4).round() / 4            # heavy ties
    lg[2::7] = 0.5                                   # one value everywhere
    if t > 4 and t <= 100:
        lg[4] = 0.25
    max_pages = -(-width // INDEX_PAGE_SIZE) + 1
    bt, _ = _paged(lens, INDEX_PAGE_SIZE, max_pages, g, device)
    info = torch.tensor([[s, s + n, i] for i, (s, n) in enumerate(zip(starts, lens))], dtype=torch.int32,
                        device=device)
    lg[:, :] = torch.where(torch.arange(width, device=device)[None, :] < info[:, :1], float("-inf"), lg)
    return {"logits": lg.float(), "row_info": info, "block_table": bt, "topk": k, "page_size": INDEX_PAGE_SIZE}


def _topk_case(m) -> GpuCase:
    import torch
    from . import ops

    def launch(inp, out, arch, get_kernel):
        t, dev = inp["logits"].shape[0], inp["logits"].device
        res = (torch.full((t, inp["topk"]), POISON, dtype=torch.int32, device=dev),
               torch.full((t,), POISON, dtype=torch.int32, device=dev))
        ops.indexer_topk(inp["logits"], inp["row_info"], inp["block_table"], topk=inp["topk"],
                         page_size=inp["page_size"], arch=arch, get_kernel=get_kernel, out=res)
        out["indices"].copy_(_f64_of_int(res[0], POISON))
        out["lengths"].copy_(_f64_of_int(res[1], POISON))

    def ref(inp, out):
        got = out["indices"].nan_to_num(-2).long()
        return _topk_check(inp, got, inp["logits"], inp["row_info"].long())

    return GpuCase("indexer_topk", lambda t, d, g: _topk_inputs(m, t, d, g), _topk_outputs, launch, ref,
                   {"indices": 0.0, "lengths": 0.0}, tokens=(1, 7, 64, 100, 2049))


def _swa_inputs(m, t: int, device, g) -> dict:
    """Requests whose tokens are one contiguous chunk (prefill) or one token (decode); SWA pages outside every
    token's window are freed (-1), as an engine frees them."""
    import torch
    wnd = m.sliding_window
    r = min(t, 16)
    share = [t // r + (1 if i < t % r else 0) for i in range(r)]
    starts = [int(torch.randint(0, 300_000, (1,), generator=g)) if i % 3 else int(torch.randint(0, 200, (1,), generator=g))
              for i in range(r)]
    max_pages = -(-(300_000 + t + 1) // SWA_PAGE_SIZE)
    bt = torch.full((r, max_pages), -1, dtype=torch.int32)
    pool = torch.randperm(r * (-(-(t + wnd) // SWA_PAGE_SIZE) + 2) + 8, generator=g).to(torch.int32)
    at = 0
    pos, req = [], []
    for i, (s, n) in enumerate(zip(starts, share)):
        first, last = max(s - wnd + 1, 0) // SWA_PAGE_SIZE, (s + n - 1) // SWA_PAGE_SIZE
        cnt = last - first + 1
        bt[i, first: last + 1] = pool[at: at + cnt]
        at += cnt
        pos += list(range(s, s + n))
        req += [i] * n
    i32 = lambda v: torch.tensor(v, dtype=torch.int32, device=device)  # noqa: E731
    return {"positions": i32(pos), "req_idx": i32(req), "block_table": bt.to(device), "window": wnd}


def _swa_case(m) -> GpuCase:
    import torch
    from . import ops, reference

    def make_outputs(inp, arch):
        t, dev = inp["positions"].shape[0], inp["positions"].device
        return {"swa_indices": torch.empty(t, inp["window"], dtype=torch.float64, device=dev),
                "swa_lengths": torch.empty(t, dtype=torch.float64, device=dev)}

    def launch(inp, out, arch, get_kernel):
        t, dev = inp["positions"].shape[0], inp["positions"].device
        res = (torch.full((t, inp["window"]), POISON, dtype=torch.int32, device=dev),
               torch.full((t,), POISON, dtype=torch.int32, device=dev))
        ops.indexer_swa_indices(inp["positions"], inp["req_idx"], inp["block_table"], window=inp["window"],
                                page_size=SWA_PAGE_SIZE, arch=arch, get_kernel=get_kernel, out=res)
        out["swa_indices"].copy_(_f64_of_int(res[0], POISON))
        out["swa_lengths"].copy_(_f64_of_int(res[1], POISON))

    def ref(inp, out):
        idx, n = reference.ref_swa_indices(inp["positions"], inp["req_idx"], inp["block_table"], inp["window"],
                                           SWA_PAGE_SIZE)
        return {"swa_indices": idx.double(), "swa_lengths": n.double()}

    return GpuCase("indexer_swa_indices", lambda t, d, g: _swa_inputs(m, t, d, g), make_outputs, launch, ref,
                   {"swa_indices": 0.0, "swa_lengths": 0.0})


def _gpu_cases(m) -> list[GpuCase]:
    cases: list[GpuCase] = []
    if RATIO in m.layer_ratios:
        cases += [_decode_logits_case(m, nn) for nn in NEXT_NS]
        cases += [_decode_topk_case(m, nn) for nn in NEXT_NS]
        cases += [_decode_logits_case(m, 1, "2d"), _decode_logits_case(m, 2, "4d"), _decode_topk_case(m, 1, True)]
        cases += [_prefill_logits_case(m), _topk_case(m)]
    cases.append(_swa_case(m))
    return cases


FAMILY = register_family(KernelFamily(
    name="indexer",
    specs=(get_spec("indexer_decode_logits"), get_spec("indexer_prefill_logits"), get_spec("indexer_topk"),
           get_spec("indexer_topk_split"), get_spec("indexer_swa_indices")),
    uses=_uses,
    gpu_cases=_gpu_cases,
    ops={"indexer_decode_logits": ("indexer_decode_logits",), "indexer_prefill_logits": ("indexer_prefill_logits",),
         "indexer_topk": ("indexer_topk", "indexer_topk_split"),
         "indexer_decode_topk": ("indexer_decode_logits", "indexer_topk", "indexer_topk_split"),
         "indexer_swa_indices": ("indexer_swa_indices",)},
    doc="lightning indexer: paged decode / ragged prefill fp8 logits, top-k + page translation, SWA index prep",
))

__all__ = ["FAMILY", "logits", "topk"]
