"""Routed-expert host ops: the routing (`moe_route`), the routed-row layout (`moe_align`, `moe_capacity`) and
the MXFP4 grouped GEMM (`fp4_moe_gemm`). Every argument is validated (ValueError naming it) before anything is selected, loaded or
compiled, except what the selected variant fixes (the GEMM's block_m: checked before the launch); `out=` for
CUDA-graph capture.

The layout: entry (t, j) of topk_ids [T, topk] is routed row t * topk + j. Rows are sorted by expert (token order
inside an expert), each expert's rows padded up to a multiple of block_m, and the whole list padded with -1 to a
fixed capacity that depends on T, topk, E and block_m only (so a CUDA graph captured at T fits every routing):

    capacity = ceil_to(T * topk + min(E, T * topk) * (block_m - 1), block_m)

block_m comes from the GEMM's variant at the engine's token count T (`fp4_moe_block_m`), the same `select` the
planner enumerates. The caller gathers activations for the sorted rows (row -1: any finite row, e.g. row 0; its
output is ignored) and scatters / combines C back by sorted_rows.
"""
from __future__ import annotations

from dsv4_jit.arch import check_arch
from dsv4_jit.spec import get_spec
from dsv4_jit.validate import int_arg

ACT_BLOCK = 128
WEIGHT_GROUP = 32


def _check_leading(t, name: str, shape: list, dtype, layout: str, device=None) -> None:
    """check_tensor for a tensor whose sizes the other arguments are checked against: a wrong rank first gets a
    message naming its layout ("expected a 2-D float32 tensor [tokens, experts]")."""
    import torch
    from dsv4_jit.validate import check_tensor
    if not isinstance(t, torch.Tensor) or t.dim() != len(shape):
        raise ValueError(f"{name}: expected a {len(shape)}-D {layout}")
    check_tensor(t, name, shape, dtype, device)


def moe_static(n: int, k: int) -> dict:
    """The static dict of fp4_moe_gemm (exactly what family.uses declares per expert weight shape)."""
    return {"n": n, "k": k}


def fp4_moe_block_m(n: int, k: int, num_tokens: int, *, arch) -> int:
    """Rows per block the GEMM variant for `num_tokens` engine tokens expects (moe_align's block_m)."""
    int_arg("num_tokens", num_tokens)
    return get_spec("fp4_moe_gemm").select(check_arch("fp4_moe_gemm", arch), moe_static(n, k), num_tokens).p["block_m"]


def moe_capacity(num_tokens: int, topk: int, num_experts: int, block_m: int) -> int:
    """Rows of the padded layout: every routing of num_tokens x topk entries over num_experts fits."""
    for name, v in (("num_tokens", num_tokens), ("topk", topk), ("num_experts", num_experts), ("block_m", block_m)):
        int_arg(name, v)
    # at most min(E, T * topk) experts get rows, each padded by at most block_m - 1
    rows = num_tokens * topk + min(num_experts, num_tokens * topk) * (block_m - 1)
    return -(-rows // block_m) * block_m


def moe_align(topk_ids, num_experts: int, block_m: int):
    """topk_ids int [T, topk] (expert of each routed entry, 0 <= id < num_experts) -> (sorted_rows int32
    [capacity], block_expert int32 [capacity / block_m]); see the module doc. Device ops only (no host sync,
    capturable in a CUDA graph); ids out of range are a ValueError only when the tensor is on the CPU (on the
    GPU they would need a sync: the GEMM clamps the expert index, so they cannot read out of bounds)."""
    import torch
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.dim() != 2 or topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError("topk_ids: expected an int32/int64 tensor [tokens, topk]")
    t, k = topk_ids.shape
    int_arg("num_experts", num_experts)
    int_arg("block_m", block_m)
    dev = topk_ids.device
    if t == 0 or k == 0:
        return torch.empty(0, dtype=torch.int32, device=dev), torch.empty(0, dtype=torch.int32, device=dev)
    if dev.type == "cpu" and (int(topk_ids.min()) < 0 or int(topk_ids.max()) >= num_experts):
        raise ValueError(f"topk_ids: expert ids must be in [0, {num_experts})")
    cap = moe_capacity(t, k, num_experts, block_m)
    flat = topk_ids.reshape(-1).long().clamp(0, num_experts - 1)
    # not torch.bincount: on CUDA it reads min/max back to the host (a sync, and an error under graph capture)
    counts = torch.zeros(num_experts, dtype=torch.long, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    pad_start = torch.cumsum(padded, 0) - padded                 # first row of each expert in the layout
    order = torch.argsort(flat, stable=True)                    # routed entries sorted by expert, token order
    sorted_ex = flat[order]
    first = torch.cumsum(counts, 0) - counts                    # first entry of each expert in `order`
    dest = pad_start[sorted_ex] + torch.arange(flat.numel(), device=dev) - first[sorted_ex]
    sorted_rows = torch.full((cap,), -1, dtype=torch.int32, device=dev)
    sorted_rows[dest] = order.to(torch.int32)
    block_start = torch.arange(cap // block_m, device=dev) * block_m
    ends = torch.cumsum(padded, 0)
    ex = torch.searchsorted(ends, block_start, right=True)
    block_expert = torch.where(block_start < ends[-1], ex, torch.full_like(ex, -1)).to(torch.int32)
    return sorted_rows, block_expert


def fp4_moe_gemm(a, a_scales, w, w_scales, block_expert, *, num_tokens: int, arch, get_kernel, out=None):
    """C [M, N] bf16: each block of block_m rows of A (fp8, 1x128 scales) times its expert's MXFP4 weight^T.

      a           torch.float8_e4m3fn [M, K]   routed rows in moe_align's layout (M = capacity)
      a_scales    fp32 [M, K / 128]
      w           uint8 [E, N, K / 2]          e2m1 pairs, element 2j in the low nibble
      w_scales    uint8 [E, N, K / 32]         UE8M0 exponents
      block_expert int32 [M / block_m]         expert per block, -1 = padding (rows written 0)
      num_tokens  the engine's token count T (selects the variant, hence block_m; see fp4_moe_block_m)
      out         bf16 [M, N]
    """
    import torch
    from dsv4_jit.validate import check_tensor
    op = "fp4_moe_gemm"
    arch = check_arch(op, arch)
    int_arg("num_tokens", num_tokens)
    _check_leading(w, "w", [None, None, None], torch.uint8, "uint8 tensor [experts, N, K / 2]")
    e, n, half_k = w.shape
    k = 2 * half_k
    dev = w.device
    if e == 0 or n == 0 or n % 128 or k == 0 or k % ACT_BLOCK:
        raise ValueError(f"w: [experts, N, K / 2] = {list(w.shape)} needs experts >= 1, N a positive multiple of 128 "
                         f"and K a positive multiple of {ACT_BLOCK}")
    check_tensor(w_scales, "w_scales", [e, n, k // WEIGHT_GROUP], torch.uint8, dev)
    _check_leading(a, "a", [None, k], torch.float8_e4m3fn, f"torch.float8_e4m3fn tensor [rows, {k}]", dev)
    m = a.shape[0]
    check_tensor(a_scales, "a_scales", [m, k // ACT_BLOCK], torch.float32, dev)
    check_tensor(block_expert, "block_expert", [None], torch.int32, dev)   # its length: block_m, below
    if out is None:
        out = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
    else:
        check_tensor(out, "out", [m, n], torch.bfloat16, dev)
    # the kernel's cp.async copies: 16-byte rows of a and w, 4-byte words of the scales and block_expert
    for t, name, align in ((a, "a", 16), (w, "w", 16), (a_scales, "a_scales", 4), (w_scales, "w_scales", 4),
                           (block_expert, "block_expert", 4)):
        if t.data_ptr() % align:
            raise ValueError(f"{name}: data pointer must be {align}-byte aligned (a view at an odd offset? .clone() it)")
    if not w.is_contiguous():
        raise ValueError("w: must be contiguous (the kernel reads it as int32 words [experts, N, K / 8])")
    if m == 0:
        check_tensor(block_expert, "block_expert", [0], torch.int32, dev)
        return out
    # select + load once: the variant for num_tokens fixes block_m, which the layout of `a` must follow
    kernel = get_kernel(get_spec(op), moe_static(n, k), num_tokens)
    bm = kernel.variant.p["block_m"]
    if m % bm:
        raise ValueError(f"a: {m} rows is not a multiple of block_m = {bm} (the variant for num_tokens="
                         f"{num_tokens}; build the layout with moe_align(..., block_m=fp4_moe_block_m(...)))")
    check_tensor(block_expert, "block_expert", [m // bm], torch.int32, dev)
    # the kernel reads 4 packed bytes (8 weights) per int32 word
    kernel(a, a_scales, w.view(torch.int32), w_scales, block_expert, out)
    return out


def route_static(experts: int, topk: int, hashed: bool) -> dict:
    """The static dict of moe_route (exactly what family.uses declares)."""
    return {"experts": experts, "topk": topk, "hashed": hashed}


def moe_route(logits, *, topk: int, routed_scaling: float = 1.0, bias=None, hash_ids=None, arch, get_kernel,
              out=None):
    """V4 routing after the gate GEMM (kernels/moe/route.py): (ids int32 [T, topk], weights fp32 [T, topk]).

      logits    fp32 [T, E]     the gate GEMM's output
      bias      fp32 [E]        the score-correction bias (selection only); or, for a hash-routed layer,
      hash_ids  int32 [T, topk] tid2eid[input_ids] (the experts are given; only weights are computed)
      routed_scaling            the weights sum to this
      out       (ids, weights) to write (CUDA-graph capture)
    """
    import torch
    from dsv4_jit.validate import check_tensor
    op = "moe_route"
    arch = check_arch(op, arch)
    _check_leading(logits, "logits", [None, None], torch.float32, "float32 tensor [tokens, experts]")
    t, e = logits.shape
    dev = logits.device
    if (bias is None) == (hash_ids is None):
        raise ValueError("bias / hash_ids: pass exactly one (bias for a scored layer, hash_ids for a hash-routed one)")
    if isinstance(routed_scaling, bool) or not isinstance(routed_scaling, (int, float)) or not routed_scaling > 0:
        raise ValueError(f"routed_scaling: must be a positive number, got {routed_scaling!r}")
    if bias is not None:
        check_tensor(bias, "bias", [e], torch.float32, dev)
    else:
        check_tensor(hash_ids, "hash_ids", [t, topk], torch.int32, dev)
    if out is None:
        out = (torch.empty(t, topk, dtype=torch.int32, device=dev), torch.empty(t, topk, dtype=torch.float32, device=dev))
    else:
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise ValueError("out: expected a pair (ids int32 [T, topk], weights fp32 [T, topk])")
        check_tensor(out[0], "out[0] (ids)", [t, topk], torch.int32, dev)
        check_tensor(out[1], "out[1] (weights)", [t, topk], torch.float32, dev)
    static = route_static(e, topk, hash_ids is not None)
    if t == 0:
        get_spec(op).select(arch, static, 1)   # no launch: select only validates experts / topk
        return tuple(out)
    get_kernel(get_spec(op), static, t)(logits, bias if bias is not None else hash_ids, out[0], out[1])
    if routed_scaling != 1.0:
        out[1].mul_(float(routed_scaling))
    return tuple(out)


def moe_entry_rows(sorted_rows, num_entries: int):
    """The inverse of moe_align's sorted_rows: int32 [num_entries], the layout row of routed entry t * topk + j
    (device ops only: -1 rows are scattered into a spare slot, never a boolean mask)."""
    import torch
    if not isinstance(sorted_rows, torch.Tensor) or sorted_rows.dim() != 1 or sorted_rows.dtype != torch.int32:
        raise ValueError("sorted_rows: expected moe_align's int32 [capacity] output")
    int_arg("num_entries", num_entries)
    dev = sorted_rows.device
    inv = torch.full((num_entries + 1,), -1, dtype=torch.int32, device=dev)
    slot = torch.where(sorted_rows >= 0, sorted_rows, torch.full_like(sorted_rows, num_entries)).long()
    inv.scatter_(0, slot, torch.arange(sorted_rows.numel(), dtype=torch.int32, device=dev))
    return inv[:num_entries].contiguous()


def moe_combine(c, entry_rows, weights, *, arch, get_kernel, out=None):
    """out [T, N] bf16 = sum_j weights[t, j] * c[entry_rows[t * topk + j]] (kernels/moe/combine.py).

      c           bf16 [M, N]        the w2 grouped GEMM's output in moe_align's layout
      entry_rows  int32 [T * topk]   moe_entry_rows(sorted_rows, T * topk)
      weights     fp32 [T, topk]     moe_route's weights
    """
    import torch
    from dsv4_jit.validate import check_tensor
    op = "moe_combine"
    arch = check_arch(op, arch)
    _check_leading(weights, "weights", [None, None], torch.float32, "float32 tensor [tokens, topk]")
    t, k = weights.shape
    dev = weights.device
    _check_leading(c, "c", [None, None], torch.bfloat16, "bfloat16 tensor [rows, N]", dev)
    n = c.shape[1]
    check_tensor(entry_rows, "entry_rows", [t * k], torch.int32, dev)
    static = {"topk": k}
    if out is None:
        out = torch.empty(t, n, dtype=torch.bfloat16, device=dev)
    else:
        check_tensor(out, "out", [t, n], torch.bfloat16, dev)
    if t == 0 or n == 0:
        get_spec(op).select(arch, static, max(t, 1))   # no launch: select only validates topk
        return out
    get_kernel(get_spec(op), static, t)(c, entry_rows, weights, out)
    return out
