"""Sparse MLA host ops: what the engine calls. Every argument is validated (ValueError naming it) before
any kernel is selected, except the workspace's size, which the selected variant's split count fixes (checked
before the launch); `out=` and `workspace=` let CUDA-graph capture run with nothing allocated; the variant
(head block, KV tile, split count) comes from `select`, the function the planner enumerates, once per call.

  sparse_mla_decode   q against the fp8_ds_mla paged cache (decode, MTP, and prefill over the paged cache)
  sparse_mla_prefill  q against gathered bf16 KV rows (ragged prefill)

Kept apart from the kernel module on purpose: the artifact key hashes kernel source only.
"""
from __future__ import annotations

from typing import Any

import torch

from dsv4_jit.arch import ArchProfile, check_arch
from dsv4_jit.spec import get_spec
from dsv4_jit.validate import int_arg

from .sparse_mla import D, ROPE, SCALE_BYTES, TOKEN_BYTES, SparseMlaCombineSpec, SparseMlaSpec

_FWD = get_spec(SparseMlaSpec.name)
_COMBINE = get_spec(SparseMlaCombineSpec.name)


def sparse_mla_workspace_numel(arch: ArchProfile, heads: int, num_tokens: int, kv_format: str = "fp8_ds_mla") -> int:
    """fp32 elements of the split workspace (partial O in bf16, two to an element, then partial log-sum-exp)
    at this token count; 0 where the kernel does not split."""
    return variant_workspace_numel(_FWD.select(arch, _static(heads, D ** -0.5, kv_format), num_tokens), num_tokens)


def variant_workspace_numel(fwd, num_tokens: int) -> int:
    """fp32 elements of forward variant `fwd`'s split workspace at this token count; 0 where it does not split or
    merges its two splits in a cluster."""
    s = fwd.p["n_splits"]
    return 0 if s == 1 or fwd.p.get("cluster") else partials_numel(s, num_tokens, fwd.p["heads"])


def partials_numel(splits: int, num_tokens: int, heads: int) -> int:
    """fp32 elements holding `splits` partial outputs (bf16 [splits, T, H, 512]) and their log-sum-exp (fp32)."""
    return splits * num_tokens * heads * (D // 2 + 1)


def carve_partials(workspace, splits: int, num_tokens: int, heads: int):
    """(partial O bf16 [splits, T, H, 512], log-sum-exp fp32 [splits, T, H]) over an fp32 workspace."""
    n_o = splits * num_tokens * heads * D // 2
    o_part = workspace[:n_o].view(torch.bfloat16).view(splits, num_tokens, heads, D)
    lse = workspace[n_o: n_o + splits * num_tokens * heads].view(splits, num_tokens, heads)
    return o_part, lse


def sparse_mla_workspace_max_numel(arch: ArchProfile, heads: int, max_tokens: int, kv_format: str = "fp8_ds_mla") -> int:
    """The largest workspace any token count <= max_tokens needs (allocate once before graph capture)."""
    return max(sparse_mla_workspace_numel(arch, heads, t, kv_format) for t in range(1, max_tokens + 1))


def _static(heads: int, scale: float, kv_format: str) -> dict[str, Any]:
    return {"heads": heads, "head_dim": D, "rope_dim": ROPE, "softmax_scale": float(scale), "kv_format": kv_format}


def _check(t, name: str, shape, dtype, device) -> None:
    from dsv4_jit.validate import check_tensor
    check_tensor(t, name, shape, dtype, device)


def _check_q(q) -> tuple[int, int]:
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise ValueError(f"q: expected a [T, H, {D}] bf16 CUDA tensor, got "
                         f"{tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__}")
    _check(q, "q", [None, None, D], torch.bfloat16, None)
    t, h = q.shape[0], q.shape[1]
    if t < 1 or not 1 <= h <= 256:
        raise ValueError(f"q: need at least one token and 1..256 heads, got shape {list(q.shape)}")
    return t, h


def _check_list(name: str, idx, lens, t: int, dev) -> None:
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.shape[1] < 1:
        raise ValueError(f"{name}: expected a [T, N] int32 CUDA tensor with N >= 1 (-1 marks a hole)")
    _check(idx, name, [t, None], torch.int32, dev)
    lname = name.replace("indices", "lengths")
    _check(lens, lname, [t], torch.int32, dev)


def _page_geometry(cache, name: str, block_size, dev) -> tuple[int, int, torch.Tensor]:
    """(pages, page stride in bytes, the pages as a contiguous uint8 [pages, stride] view) of an fp8_ds_mla cache:
    a contiguous [num_pages, page_bytes] buffer, or a view of one whose dim 0 is the page (vLLM 0.33 binds
    [num_blocks, states, 584] at a block stride rounded up to 576 B): each page's bytes contiguous, only the page
    stride padded."""
    from dsv4_jit.validate import check_tensor
    if not isinstance(cache, torch.Tensor) or cache.dim() < 2:
        raise ValueError(f"{name}: expected a uint8 [num_pages, page_bytes] (or [num_pages, ...]) CUDA tensor")
    if cache.dtype != torch.uint8:
        raise ValueError(f"{name}: expected dtype torch.uint8 (fp8_ds_mla bytes), got {cache.dtype}")
    check_tensor(cache, name, [None] * cache.dim(), torch.uint8, dev, contiguous=False)
    int_arg("block_size", block_size, op=name)
    pages = cache.shape[0]
    if pages < 1:
        raise ValueError(f"{name}: needs at least one page")
    if not cache[0].is_contiguous():
        raise ValueError(f"{name}: a page's bytes must be contiguous (only the page stride may be padded)")
    content = cache[0].numel()
    pb = cache.stride(0) if pages > 1 else content   # a lone page's stride says nothing
    need = block_size * (TOKEN_BYTES + SCALE_BYTES)
    if pb % 16 or pb < max(need, content):
        raise ValueError(f"{name}: a page of {block_size} tokens needs >= {need} B at a stride that is a multiple of "
                         f"16 B (fp8_ds_mla: 576 B per token then 8 B of scales); got {pages} pages of {content} B "
                         f"at a {pb} B stride")
    try:
        flat = torch.as_strided(cache, (pages, pb), (pb, 1))
    except RuntimeError as e:   # the last page's padding lies outside the tensor's storage
        raise ValueError(f"{name}: {pages} pages at a {pb} B stride overrun the tensor's storage ({e})") from None
    return pages, pb, flat


def _check_ranges(name: str, idx, lens, rows: int) -> None:
    """One device reduction + sync: every candidate inside its token's length must be -1 or a row/slot
    of the cache. (The kernel masks bad entries anyway; this turns them into an error.)"""
    n = idx.shape[1]
    lname = name.replace("indices", "lengths")
    bad_len = ((lens < 0) | (lens > n)).any()
    pos = torch.arange(n, device=idx.device)[None, :]
    live = pos < lens[:, None]
    bad_idx = (live & ((idx < -1) | (idx >= rows))).any()
    bl, bi = (bool(x) for x in torch.stack([bad_len, bad_idx]).tolist())
    if bl:
        raise ValueError(f"{lname}: every length must lie in [0, {n}] (the width of {name})")
    if bi:
        raise ValueError(f"{name}: an entry inside its token's length is outside the cache (valid: -1 or 0..{rows - 1})")


def _want_check(check_indices) -> bool:
    if check_indices is None:
        # a host sync is not allowed under graph capture; the kernel still masks bad entries there
        return not torch.cuda.is_current_stream_capturing()
    return bool(check_indices)


_ZERO_LENS: dict[tuple, torch.Tensor] = {}


def _no_list(idx, t: int):
    """An empty second list: the first list's indices with all lengths 0 (one cached zeros tensor per T)."""
    key = (idx.device, t)
    z = _ZERO_LENS.get(key)
    if z is None:
        z = _ZERO_LENS[key] = torch.zeros(t, dtype=torch.int32, device=idx.device)
    return idx, z


def _fp8_views(cache, pages: int, pb: int):
    flat = cache.view(pages, pb)
    rows = pb // 16
    return (flat.view(torch.float8_e4m3fn).view(pages, rows, 16), flat.view(pages, rows, 16),
            flat.view(torch.bfloat16).view(pages, rows, 8))


def _out(q, t: int, h: int, out, workspace):
    """out, allocated or checked; the workspace's dtype and device (its size depends on the variant: _partials)."""
    dev = q.device
    if out is None:
        out = torch.empty(t, h, D, dtype=torch.bfloat16, device=dev)
    else:
        _check(out, "out", [t, h, D], torch.bfloat16, dev)
    if workspace is not None:
        from dsv4_jit.validate import require_1d
        require_1d(workspace, "workspace", torch.float32, dev)
    return out


def _partials(q, t: int, h: int, splits: int, workspace):
    """The split kernel's partial O and log-sum-exp, carved from the workspace (allocated when not given)."""
    dev = q.device
    if splits == 1:
        return _dummy_parts(dev, h)
    need = partials_numel(splits, t, h)
    if workspace is None:
        workspace = torch.empty(need, dtype=torch.float32, device=dev)
    elif workspace.numel() < need:
        raise ValueError(f"workspace: needs >= {need} fp32 elements at T={t}, H={h} "
                         f"({splits} splits; see sparse_mla_workspace_max_numel), got {workspace.numel()}")
    return carve_partials(workspace, splits, t, h)


_DUMMY: dict[tuple, tuple] = {}


def _dummy_parts(dev, h: int):
    # the unsplit kernel never touches the partials; a one-token placeholder satisfies the signature
    key = (dev, h)
    d = _DUMMY.get(key)
    if d is None:
        d = _DUMMY[key] = (torch.empty(1, 1, h, D, dtype=torch.bfloat16, device=dev),
                           torch.empty(1, 1, h, dtype=torch.float32, device=dev))
    return d


def _launch(q, static, t: int, h: int, out, workspace, attn_sink, args, lists, get_kernel) -> None:
    """Select + load once (get_kernel), size the partials from the variant it returned, launch. lists: the two
    index lists and their lengths, which the combine splits as the forward kernel did."""
    fwd = get_kernel(_FWD, static, t)
    s = fwd.variant.p["n_splits"]
    # a cluster variant merges its two splits in the launch, through shared memory: no partials, no combine
    merged = bool(fwd.variant.p.get("cluster"))
    o_part, lse = _partials(q, t, h, 1 if merged else s, workspace)
    if s == 1 or merged:
        fwd(*args, attn_sink, out, o_part, lse)
    else:
        fwd(*args, attn_sink, out[:1], o_part, lse)
        idx1, lens1, idx2, lens2 = lists
        get_kernel(_COMBINE, static, t)(o_part, lse, attn_sink, lens1, lens2, idx1.shape[1], idx2.shape[1], out)


def sparse_mla_decode(q, kv_cache, indices, lengths, attn_sink, *, block_size: int, extra_kv_cache=None,
                      extra_indices=None, extra_lengths=None, extra_block_size: int | None = None,
                      softmax_scale: float | None = None, out=None, workspace=None, check_indices=None,
                      arch, get_kernel):
    """Sparse MLA with the sink over the fp8_ds_mla paged cache. Returns out [T, H, 512] bf16.

    q [T, H, 512] bf16 (after q head-norm and RoPE); kv_cache uint8 [pages, page_bytes] (FlashMLA MODEL1
    FP8 sparse pages of `block_size` tokens), or vLLM's [pages, states, 584] view at a padded page stride; indices [T, N] int32 slots (page * block_size + offset, -1 =
    hole) with lengths [T] int32 (entries past a token's length are ignored); attn_sink [H] fp32. The
    optional extra_* list reads a second cache (the compressed cache beside the SWA window). MTP: the 1+K
    query tokens of a request are rows of q with their own lists. softmax_scale defaults to 512^-0.5.
    workspace: fp32, >= sparse_mla_workspace_numel() elements (used when the kernel splits a token's
    candidates across CTAs). check_indices: None = check ranges (one host sync) unless capturing."""
    check_arch("sparse_mla_decode", arch)
    t, h = _check_q(q)
    dev = q.device
    _check_list("indices", indices, lengths, t, dev)
    pages1, pb1, flat1 = _page_geometry(kv_cache, "kv_cache", block_size, dev)
    _check(attn_sink, "attn_sink", [h], torch.float32, dev)
    extra = (extra_kv_cache, extra_indices, extra_lengths)
    if any(x is not None for x in extra) and not all(x is not None for x in extra):
        raise ValueError("extra_kv_cache, extra_indices and extra_lengths go together (pass all three or none)")
    if extra_kv_cache is not None:
        bs2 = block_size if extra_block_size is None else extra_block_size
        _check_list("extra_indices", extra_indices, extra_lengths, t, dev)
        pages2, pb2, flat2 = _page_geometry(extra_kv_cache, "extra_kv_cache", bs2, dev)
    scale = D ** -0.5 if softmax_scale is None else softmax_scale
    static = _static(h, scale, "fp8_ds_mla")
    out = _out(q, t, h, out, workspace)
    if _want_check(check_indices):
        _check_ranges("indices", indices, lengths, pages1 * block_size)
        if extra_kv_cache is not None:
            _check_ranges("extra_indices", extra_indices, extra_lengths, pages2 * bs2)
    v1 = _fp8_views(flat1, pages1, pb1)
    if extra_kv_cache is None:
        v2, (idx2, lens2), bs2 = v1, _no_list(indices, t), block_size
    else:
        v2, idx2, lens2 = _fp8_views(flat2, pages2, pb2), extra_indices, extra_lengths
    args = (q, *v1, indices, lengths, *v2, idx2, lens2, int(block_size), int(bs2))
    _launch(q, static, t, h, out, workspace, attn_sink, args, (indices, lengths, idx2, lens2), get_kernel)
    return out


def sparse_mla_prefill(q, kv, indices, lengths, attn_sink, *, extra_kv=None, extra_indices=None,
                       extra_lengths=None, softmax_scale: float | None = None, out=None, workspace=None,
                       check_indices=None, arch, get_kernel):
    """Sparse MLA with the sink over gathered bf16 KV rows kv [N, 512] (ragged prefill: each query token
    carries its own candidate rows). indices [T, N_idx] int32 rows of kv (-1 = hole), lengths [T]; the
    optional extra_* list reads a second row set. Returns out [T, H, 512] bf16."""
    check_arch("sparse_mla_prefill", arch)
    t, h = _check_q(q)
    dev = q.device
    _check_list("indices", indices, lengths, t, dev)
    if not isinstance(kv, torch.Tensor) or kv.dim() != 2:
        raise ValueError(f"kv: expected a [N, {D}] bf16 CUDA tensor")
    _check(kv, "kv", [None, D], torch.bfloat16, dev)
    _check(attn_sink, "attn_sink", [h], torch.float32, dev)
    extra = (extra_kv, extra_indices, extra_lengths)
    if any(x is not None for x in extra) and not all(x is not None for x in extra):
        raise ValueError("extra_kv, extra_indices and extra_lengths go together (pass all three or none)")
    if extra_kv is not None:
        if not isinstance(extra_kv, torch.Tensor) or extra_kv.dim() != 2:
            raise ValueError(f"extra_kv: expected a [N, {D}] bf16 CUDA tensor")
        _check(extra_kv, "extra_kv", [None, D], torch.bfloat16, dev)
        _check_list("extra_indices", extra_indices, extra_lengths, t, dev)
    if kv.shape[0] < 1 or (extra_kv is not None and extra_kv.shape[0] < 1):
        raise ValueError("kv: needs at least one row")
    scale = D ** -0.5 if softmax_scale is None else softmax_scale
    static = _static(h, scale, "bf16")
    out = _out(q, t, h, out, workspace)
    if _want_check(check_indices):
        _check_ranges("indices", indices, lengths, kv.shape[0])
        if extra_kv is not None:
            _check_ranges("extra_indices", extra_indices, extra_lengths, extra_kv.shape[0])
    if extra_kv is None:
        kv2, (idx2, lens2) = kv, _no_list(indices, t)
    else:
        kv2, idx2, lens2 = extra_kv, extra_indices, extra_lengths
    _launch(q, static, t, h, out, workspace, attn_sink, (q, kv, indices, lengths, kv2, idx2, lens2),
            (indices, lengths, idx2, lens2), get_kernel)
    return out
