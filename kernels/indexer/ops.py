"""Indexer host ops: what the engine calls for every ratio-4 layer (logits, top-k) and once per forward (SWA
index prep). Validate every argument (ValueError naming it) before anything is selected, loaded or compiled;
allocate only what the caller did not pass (`out=`, `workspace=` for CUDA-graph capture); launch the variant
`select` picked through `get_kernel(spec, static, num_tokens)`.

Every op here is TileLang end to end (no torch.topk, no torch math on the hot path).

Tensor conventions (T query tokens, H = 64 index heads, D = 128, P = page size):
  q        [T, H, D] torch.float8_e4m3fn;  q_scale [T] fp32 (> 0);  weights [T, H] fp32
  kv_cache uint8, [num_pages, page_bytes], [num_pages, P, D + 4] or [num_pages, P, 1, D + 4] (DeepGEMM's
           shape): per page P*D fp8 values, then P fp32 scales (> 0), at a page stride >= P * (D + 4) B in a
           multiple of 16 (vLLM pads it to a multiple of 576 B)
  decode:  T = batch * next_n; seq_lens [batch] int32 = request length in tokens INCLUDING this step's next_n
           tokens; block_table [batch, max_pages] int32 over compressed positions (-1 past the length is fine)
  logits   [T, W] fp32, -inf outside each token's range; W >= the longest compressed length (default
           max_pages * P for decode, Nk for prefill)
  row_info [T, 3] int32 = (first column, end column, request) per token, written by the logits kernels and
           read by indexer_topk
"""
from __future__ import annotations

from typing import Any

from dsv4_jit.arch import check_arch
from dsv4_jit.spec import get_spec
from dsv4_jit.validate import int_arg

from .logits import SCALE_BYTES
from .topk import ROW_WS, topk_splits

DEFAULT_RATIO = 4


def _q_args(q, q_scale, weights):
    import torch
    from dsv4_jit.validate import check_tensor
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise ValueError("q: expected a [T, heads, dim] torch.float8_e4m3fn tensor")
    check_tensor(q, "q", [None, None, None], torch.float8_e4m3fn)
    tokens, heads, dim = q.shape
    dev = q.device
    check_tensor(q_scale, "q_scale", [tokens], torch.float32, dev)
    check_tensor(weights, "weights", [tokens, heads], torch.float32, dev)
    return tokens, heads, dim, dev


PAGE_SIZES = (16, 32, 64, 128, 256)
PAGE_PAD_MAX = 576  # vLLM rounds an index-K page up to a multiple of 576 B (fp8_ds_mla)


def _page_size_of(page_bytes: int, row: int, page_size) -> int:
    """The page size of a 2-D cache [num_pages, page_bytes]: the caller's, else page_bytes / row when exact, else
    the one supported size whose page vLLM's padding (< 576 B) rounds up to page_bytes."""
    if page_size is not None:
        return int_arg("page_size", page_size, op="indexer_decode_logits", allowed=PAGE_SIZES)
    if page_bytes % row == 0:
        return page_bytes // row
    fits = [p for p in PAGE_SIZES if p * row <= page_bytes < p * row + PAGE_PAD_MAX]
    if not fits:
        raise ValueError(f"kv_cache: {page_bytes} bytes per page is not page_size * {row} (+ padding below "
                         f"{PAGE_PAD_MAX} B) for a page size in {PAGE_SIZES}; pass page_size=")
    return fits[0]


def _kv_cache_views(kv_cache, dim: int, dev, page_size=None):
    """(page_size, fp32 rows [pages, stride/16, 4], strided fp8 K rows [pages, P, D]) of the paged index-K cache:
    per page P*D fp8 values then P fp32 scales, from the page's start; the page stride is the tensor's own
    (>= P*(D+4) bytes, a multiple of 16)."""
    import torch
    from dsv4_jit.validate import check_tensor
    row = dim + SCALE_BYTES
    if not isinstance(kv_cache, torch.Tensor) or kv_cache.dim() not in (2, 3, 4) or kv_cache.dtype != torch.uint8:
        raise ValueError("kv_cache: expected a uint8 [num_pages, page_bytes], [num_pages, page_size, dim + 4] or "
                         "[num_pages, page_size, 1, dim + 4] tensor")
    if kv_cache.shape[0] < 1:
        raise ValueError("kv_cache: needs at least one page")
    if kv_cache.dim() == 2:
        stride = kv_cache.shape[1]
        p = _page_size_of(stride, row, page_size)
    else:
        shape = [None, None, row] if kv_cache.dim() == 3 else [None, None, 1, row]
        if list(kv_cache.shape[2:]) != shape[2:]:
            raise ValueError(f"kv_cache: expected shape [num_pages, page_size{', 1' if kv_cache.dim() == 4 else ''}, "
                             f"{row}], got {list(kv_cache.shape)}")
        p = kv_cache.shape[1]
        if page_size is not None and page_size != p:
            raise ValueError(f"kv_cache: page_size={page_size} but the cache's pages hold {p} positions")
        if not kv_cache[0].is_contiguous():
            raise ValueError("kv_cache: a page's bytes must be contiguous (only the page stride may be padded)")
        stride = kv_cache.stride(0)
    if p not in PAGE_SIZES:
        raise ValueError(f"kv_cache: page_size {p} is not supported (supported: {list(PAGE_SIZES)})")
    if stride < p * row or stride % 16:
        raise ValueError(f"kv_cache: a page of {p} positions needs >= {p * row} B at a stride that is a multiple of "
                         f"16 B; got {stride} B")
    # the pages may sit at a padded stride (a view of a [num_pages, page_bytes] buffer): dim 0 alone may be
    # non-contiguous
    check_tensor(kv_cache, "kv_cache", [None] * kv_cache.dim(), torch.uint8, dev, contiguous=kv_cache.dim() == 2)
    pages = kv_cache.shape[0]
    try:
        flat = torch.as_strided(kv_cache, (pages, stride), (stride, 1))
    except RuntimeError as e:  # the last page's padding is outside the tensor's storage
        raise ValueError(f"kv_cache: {pages} pages at a {stride} B stride overrun the tensor's storage ({e})") from None
    kv_f32 = flat.view(torch.float32).view(pages, stride // 16, 4)
    kv_fp8 = torch.as_strided(flat.view(torch.float8_e4m3fn), (pages, p, dim), (stride, dim, 1))
    return p, kv_f32, kv_fp8


def _out_2d(t, name: str, shape: tuple, dtype, dev):
    import torch
    from dsv4_jit.validate import check_tensor
    if t is None:
        return torch.empty(shape, dtype=dtype, device=dev)
    check_tensor(t, name, list(shape), dtype, dev)
    return t


def _check_block_table(block_table, dev) -> None:
    """A page table [batch, max_pages] int32 with at least one row and one column (top-k, SWA prep)."""
    import torch
    from dsv4_jit.validate import check_tensor
    if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2:
        raise ValueError("block_table: expected an int32 [batch, max_pages] tensor")
    check_tensor(block_table, "block_table", [None, None], torch.int32, dev)
    if block_table.shape[0] < 1 or block_table.shape[1] < 1:
        raise ValueError(f"block_table: needs at least one row and one column, got {list(block_table.shape)}")


def _index_outputs(out, names: tuple[str, str], tokens: int, width: int, dev):
    """(indices [T, width], lengths [T]) int32: the caller's `out` pair checked, or allocated."""
    import torch
    from dsv4_jit.validate import check_tensor
    indices, lengths = (None, None) if out is None else out
    indices = _out_2d(indices, f"out[0] ({names[0]})", (tokens, width), torch.int32, dev)
    if lengths is None:
        lengths = torch.empty(tokens, dtype=torch.int32, device=dev)
    else:
        check_tensor(lengths, f"out[1] ({names[1]})", [tokens], torch.int32, dev)
    return indices, lengths


# =============================================================================================
# logits
# =============================================================================================
def decode_static(heads: int, dim: int, next_n: int, page_size: int, ratio: int = DEFAULT_RATIO,
                  clean: bool = True) -> dict:
    """The static dict of indexer_decode_logits (exactly what family.uses declares per call site)."""
    return {"heads": heads, "dim": dim, "ratio": ratio, "next_n": next_n, "page_size": page_size, "clean": clean}


def indexer_decode_logits(q, q_scale, weights, kv_cache, seq_lens, block_table, *, next_n: int, arch, get_kernel,
                          ratio: int = DEFAULT_RATIO, width: int | None = None, out=None, row_info=None,
                          clean: bool = True, page_size: int | None = None):
    """Paged decode logits (see kernels/indexer/logits.py). Returns (logits [T, W] fp32, row_info [T, 3] int32).

    `out` / `row_info` may be preallocated (CUDA-graph capture); W is out.shape[1], else `width`, else
    max_pages * page_size. Rows of a request whose compressed length exceeds W are cut at W. clean=False (as
    DeepGEMM's clean_logits) leaves the columns outside the tiles a token group's ranges reach unwritten: for a
    consumer that reads only row_info's [lo, hi) (indexer_topk does). page_size: positions per page, needed
    only for a 2-D cache whose padded page stride does not tell it (vLLM's padding is inferred)."""
    import torch
    from dsv4_jit.validate import check_tensor

    op = "indexer_decode_logits"
    arch = check_arch(op, arch)
    next_n = int_arg("next_n", next_n, op=op, allowed=(1, 2, 3, 4))
    ratio = int_arg("ratio", ratio, op=op)
    if not isinstance(clean, bool):
        raise ValueError(f"clean: expected a bool, got {clean!r}")
    tokens, heads, dim, dev = _q_args(q, q_scale, weights)
    if tokens % next_n:
        raise ValueError(f"q: {tokens} tokens is not a multiple of next_n={next_n}")
    batch = tokens // next_n
    page_size, kv_f32, kv_fp8 = _kv_cache_views(kv_cache, dim, dev, page_size)
    check_tensor(seq_lens, "seq_lens", [batch], torch.int32, dev)
    if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2:
        raise ValueError(f"block_table: expected an int32 [{batch}, max_pages] tensor")
    check_tensor(block_table, "block_table", [batch, None], torch.int32, dev)
    if block_table.shape[1] < 1:
        raise ValueError("block_table: needs at least one page column")
    if out is not None:
        check_tensor(out, "out", [tokens, None], torch.float32, dev)
        w = out.shape[1]
    else:
        w = block_table.shape[1] * page_size if width is None else int_arg("width", width, op=op)
    out = _out_2d(out, "out", (tokens, w), torch.float32, dev)
    row_info = _out_2d(row_info, "row_info", (tokens, 3), torch.int32, dev)
    if tokens == 0 or w == 0:
        return out, row_info
    kernel = get_kernel(get_spec("indexer_decode_logits"), decode_static(heads, dim, next_n, page_size, ratio, clean),
                        tokens)
    kernel(q, q_scale, weights, kv_f32, kv_fp8, seq_lens, block_table, out, row_info)
    return out, row_info


def indexer_prefill_logits(q, q_scale, weights, k, k_scale, ks, ke, req_idx, *, arch, get_kernel,
                           width: int | None = None, out=None, row_info=None):
    """Ragged prefill logits over a contiguous compressed K [Nk, D] fp8 + k_scale [Nk] fp32: token t sees
    columns [ks[t], ke[t]); req_idx[t] is its request (block-table row for indexer_topk). W defaults to Nk."""
    import torch
    from dsv4_jit.validate import check_tensor

    op = "indexer_prefill_logits"
    arch = check_arch(op, arch)
    tokens, heads, dim, dev = _q_args(q, q_scale, weights)
    if not isinstance(k, torch.Tensor) or k.dim() != 2:
        raise ValueError(f"k: expected a [num_k, {dim}] torch.float8_e4m3fn tensor")
    check_tensor(k, "k", [None, dim], torch.float8_e4m3fn, dev)
    num_k = k.shape[0]
    check_tensor(k_scale, "k_scale", [num_k], torch.float32, dev)
    for t, name in ((ks, "ks"), (ke, "ke"), (req_idx, "req_idx")):
        check_tensor(t, name, [tokens], torch.int32, dev)
    if out is not None:
        check_tensor(out, "out", [tokens, None], torch.float32, dev)
        w = out.shape[1]
    else:
        w = num_k if width is None else int_arg("width", width, op=op)
    out = _out_2d(out, "out", (tokens, w), torch.float32, dev)
    row_info = _out_2d(row_info, "row_info", (tokens, 3), torch.int32, dev)
    if tokens == 0 or w == 0 or num_k == 0:
        if tokens and w:
            out.fill_(float("-inf"))
            row_info.zero_()
        return out, row_info
    kernel = get_kernel(get_spec("indexer_prefill_logits"), {"heads": heads, "dim": dim}, tokens)
    kernel(q, q_scale, weights, k, k_scale, ks, ke, req_idx, out, row_info)
    return out, row_info


# =============================================================================================
# top-k
# =============================================================================================
def indexer_topk(logits, row_info, block_table, *, topk: int, page_size: int, arch, get_kernel, out=None,
                 workspace=None):
    """Top-`topk` columns of each row within its row_info range, as compressed-cache slots (a set, any order,
    -1 padded). Returns (indices [T, topk] int32, lengths [T] int32)."""
    import torch
    from dsv4_jit.validate import check_tensor

    op = "indexer_topk"
    arch = check_arch(op, arch)
    topk = int_arg("topk", topk, op=op)
    page_size = int_arg("page_size", page_size, op=op)
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise ValueError("logits: expected a [T, W] fp32 tensor")
    check_tensor(logits, "logits", [None, None], torch.float32)
    tokens, dev = logits.shape[0], logits.device
    check_tensor(row_info, "row_info", [tokens, 3], torch.int32, dev)
    _check_block_table(block_table, dev)
    indices, lengths = _index_outputs(out, ("indices", "lengths"), tokens, topk, dev)
    if tokens == 0:
        return indices, lengths
    static = {"topk": topk, "page_size": page_size}
    if topk_splits(tokens, arch.num_sms_hint) == 1:
        kernel = get_kernel(get_spec("indexer_topk"), static, tokens)
        kernel(logits, row_info, block_table, indices, lengths)
        return indices, lengths
    # few rows: each row split over several CTAs (one launch, row barriers) over a workspace that is zeroed once
    # and that every launch leaves zeroed
    kernel = get_kernel(get_spec("indexer_topk_split"), static, tokens)
    need = indexer_topk_workspace_numel(tokens)
    if workspace is None:
        workspace = torch.zeros(need, dtype=torch.int32, device=dev)
    else:
        from dsv4_jit.validate import require_1d
        require_1d(workspace, "workspace", torch.int32, dev)
        if workspace.numel() < need:
            raise ValueError(f"workspace: needs >= {need} int32 elements at T={tokens} (indexer_topk_workspace_numel)")
        _zero_once(workspace)
    kernel(logits, row_info, block_table, workspace[:need].view(tokens, ROW_WS), indices, lengths)
    return indices, lengths


# A flag on the workspace tensor object marks it zeroed: the kernel restores the zeros on every launch, so a caller's
# workspace is zeroed on its first use only and a CUDA graph captured after that first call holds no memset. (A new
# view of the same memory carries no flag and is zeroed again: slower, never wrong.)
_ZEROED_ATTR = "_dsv4_topk_ws_zeroed"


def _zero_once(workspace) -> None:
    if not getattr(workspace, _ZEROED_ATTR, False):
        workspace.zero_()
        setattr(workspace, _ZEROED_ATTR, True)


def indexer_topk_workspace_numel(num_tokens: int) -> int:
    """int32 elements of indexer_topk's workspace at this token count (the row-split path). Pass the same tensor
    on every call: it is zeroed on its first use here and every launch leaves it zeroed, so calls after the
    first (and CUDA graphs captured after it) run no memset. A workspace sized for T tokens serves any smaller T."""
    return num_tokens * ROW_WS


def indexer_decode_topk(q, q_scale, weights, kv_cache, seq_lens, block_table, *, next_n: int, topk: int, arch,
                        get_kernel, ratio: int = DEFAULT_RATIO, width: int | None = None, workspace=None, out=None,
                        page_size: int | None = None):
    """One decode step of a ratio-4 layer's indexer: paged logits, then top-k with page-table translation.

    workspace = (logits [T, W] fp32, row_info [T, 3] int32[, top-k histograms: int32, indexer_topk_workspace_numel])
    and out = (indices [T, topk], lengths [T]) int32 may be preallocated (CUDA-graph capture).
    Returns (indices, lengths)."""
    if workspace is not None and (not isinstance(workspace, (tuple, list)) or len(workspace) not in (2, 3)):
        raise ValueError("workspace: expected (logits, row_info) or (logits, row_info, topk_histograms)")
    logits, row_info, hist = (None, None, None) if workspace is None else (*workspace, None)[:3]
    # the top-k reads only each row's [lo, hi): no -inf past the request's length (clean=False)
    logits, row_info = indexer_decode_logits(q, q_scale, weights, kv_cache, seq_lens, block_table, next_n=next_n,
                                             arch=arch, get_kernel=get_kernel, ratio=ratio, width=width,
                                             out=logits, row_info=row_info, clean=False, page_size=page_size)
    page_size = _kv_cache_views(kv_cache, q.shape[2], q.device, page_size)[0]
    return indexer_topk(logits, row_info, block_table, topk=topk, page_size=page_size, arch=arch,
                        get_kernel=get_kernel, out=out, workspace=hist)


# =============================================================================================
# SWA index prep
# =============================================================================================
def indexer_swa_indices(positions, req_idx, block_table, *, window: int, page_size: int, arch, get_kernel,
                        out=None):
    """Sliding-window slots of every query token over a paged SWA cache. positions [T] int32
    (absolute, 0-based), req_idx [T] int32, block_table [batch, max_pages] int32 over token positions (-1 for
    freed pages outside the window is fine). Returns (swa_indices [T, window] int32, swa_lengths [T] int32); see
    swa.py."""
    import torch
    from dsv4_jit.validate import check_tensor

    op = "indexer_swa_indices"
    arch = check_arch(op, arch)
    window = int_arg("window", window, op=op)
    page_size = int_arg("page_size", page_size, op=op)
    if not isinstance(positions, torch.Tensor) or positions.dim() != 1:
        raise ValueError("positions: expected an int32 [T] tensor")
    check_tensor(positions, "positions", [None], torch.int32)
    tokens, dev = positions.shape[0], positions.device
    check_tensor(req_idx, "req_idx", [tokens], torch.int32, dev)
    _check_block_table(block_table, dev)
    indices, lengths = _index_outputs(out, ("swa_indices", "swa_lengths"), tokens, window, dev)
    if tokens == 0:
        return indices, lengths
    kernel = get_kernel(get_spec("indexer_swa_indices"), {"window": window, "page_size": page_size}, tokens)
    kernel(positions, req_idx, block_table, indices, lengths)
    return indices, lengths


__all__: list[Any] = ["indexer_decode_logits", "indexer_prefill_logits", "indexer_topk", "indexer_decode_topk",
                      "indexer_topk_workspace_numel",
                      "indexer_swa_indices", "decode_static"]
