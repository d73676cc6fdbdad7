"""FP8 block-scaled GEMM host op: validate every argument (ValueError naming it) before anything is selected,
loaded or compiled (the workspace's size, which the variant's split count fixes, before the launch); allocate
only what the caller did not pass (`out=`, `workspace=` for CUDA-graph capture); launch the variant `select`
picked; a split-K variant sums its partials in the same launch (the last CTA of each output tile, up to 32-row
tiles) or in fp8_gemm_reduce behind it (64-row tiles; see fp8_gemm.sums_in_kernel).

  a         torch.float8_e4m3fn [M, G*K]      activations (act_quant_fp8 output)
  a_scales  fp32 [M, G*K/128]                 per-token 1x128 scales (powers of two)
  b         torch.float8_e4m3fn [G*N, K]      weight(s) as stored (row n = output feature), G stacked for groups
  b_scales  fp32 [G*ceil(N/128), K/128]       128x128 block scales (the checkpoint's float8_e8m0fnu `scale`
            converted once at load: `scale.float()`)
  out       bf16 [M, G*N]
  workspace fp32, 1-D, >= fp8_gemm_workspace_numel(...) elements; pass the same tensor on every call: its
            first FIXUP_COUNTERS elements are the split-K tiles' arrival counters, zeroed on the tensor's first
            split-K use here and left zero by every launch (no memset after that call, none in a CUDA graph
            captured after it), then the fp32 partials. Only used when the
            variant splits (M <= 256 and the weight alone would not fill the GPU). Ops that may run at the same
            time (other streams) need workspaces of their own; ops that run one after another may share one.
"""
from __future__ import annotations

from dsv4_jit.arch import check_arch
from dsv4_jit.spec import get_spec
from dsv4_jit.validate import int_arg

from .fp8_gemm import sums_in_kernel

QBLOCK = 128
# int32 arrival counters at the workspace's start, one per output tile of a split variant: a fixed region, so a
# workspace sized for the largest shape and token count serves every GEMM (its partials follow it). A split
# variant has fewer tiles than SMs (decode_split), far below this.
FIXUP_COUNTERS = 1024


def gemm_static(n: int, k: int, groups: int = 1) -> dict:
    """The static dict of fp8_gemm (exactly what family.uses declares per weight shape)."""
    return {"n": n, "k": k, "groups": groups}


# A flag on the workspace tensor object marks its counters zeroed: every launch leaves them zero, so a caller's
# workspace is zeroed on its first split-K use only and a CUDA graph captured after that call holds no memset. (A new
# view of the same memory carries no flag and is zeroed again: slower, never wrong.)
_ZEROED_ATTR = "_dsv4_gemm_ws_zeroed"


def _zero_counters_once(workspace) -> None:
    if not getattr(workspace, _ZEROED_ATTR, False):
        workspace[:FIXUP_COUNTERS].zero_()
        setattr(workspace, _ZEROED_ATTR, True)


def fp8_gemm_workspace_numel(n: int, k: int, num_tokens: int, *, arch, groups: int = 1) -> int:
    """fp32 elements of the split-K workspace at this token count (0 when the variant does not split): the
    FIXUP_COUNTERS arrival counters, then split x M x groups x N partials."""
    if num_tokens < 1:
        return 0
    p = get_spec("fp8_gemm").select(check_arch("fp8_gemm", arch), gemm_static(n, k, groups), num_tokens).p
    return 0 if p["split"] == 1 else FIXUP_COUNTERS + p["split"] * num_tokens * groups * n


def fp8_gemm_workspace_max_numel(n: int, k: int, max_tokens: int, *, arch, groups: int = 1) -> int:
    """fp32 elements of a workspace that serves this GEMM at every token count <= max_tokens (only M <= 256 split):
    allocate it once and pass it on every call (its counters are zeroed on its first split-K use). GEMMs that run
    one after another may share the largest."""
    from .fp8_gemm import SPLIT_MAX_M
    return max([0] + [fp8_gemm_workspace_numel(n, k, t, arch=arch, groups=groups)
                      for t in range(1, min(int_arg("max_tokens", max_tokens), SPLIT_MAX_M) + 1)])


def split_tiles(p: dict, num_tokens: int) -> int:
    """Output tiles (one arrival counter each) of split variant params `p` at this token count."""
    return -(-num_tokens // p["block_m"]) * p["groups"] * (p["n"] // p["block_n"])


def fp8_gemm(a, a_scales, b, b_scales, *, arch, get_kernel, groups: int = 1, out=None, workspace=None):
    """C [M, G*N] bf16 = A . B^T with fp32 accumulation and the scales applied per 128-wide K block."""
    import torch
    from dsv4_jit.validate import check_tensor, require_1d
    op = "fp8_gemm"
    arch = check_arch(op, arch)
    int_arg("groups", groups)
    if not isinstance(a, torch.Tensor) or a.dim() != 2:
        raise ValueError("a: expected a 2-D torch.float8_e4m3fn tensor [tokens, K]")
    check_tensor(a, "a", [None, None], torch.float8_e4m3fn)
    m, gk = a.shape
    dev = a.device
    if gk % (groups * QBLOCK) or gk == 0:
        raise ValueError(f"a: K = {gk} must be a positive multiple of groups * 128 = {groups * QBLOCK}")
    k = gk // groups
    if not isinstance(b, torch.Tensor) or b.dim() != 2:
        raise ValueError(f"b: expected a 2-D torch.float8_e4m3fn tensor [groups * N, {k}]")
    check_tensor(b, "b", [None, k], torch.float8_e4m3fn, dev)
    gn = b.shape[0]
    if gn % groups or gn == 0 or (gn // groups) % 64:
        raise ValueError(f"b: {gn} rows is not groups ({groups}) x N with N a positive multiple of 64")
    n = gn // groups
    nq = -(-n // QBLOCK)
    check_tensor(a_scales, "a_scales", [m, gk // QBLOCK], torch.float32, dev)
    check_tensor(b_scales, "b_scales", [groups * nq, k // QBLOCK], torch.float32, dev)
    if out is None:
        out = torch.empty(m, gn, dtype=torch.bfloat16, device=dev)
    else:
        check_tensor(out, "out", [m, gn], torch.bfloat16, dev)
    if workspace is not None:
        require_1d(workspace, "workspace", torch.float32, dev)
    if m == 0:
        return out
    # select + load once; the variant it returns fixes the split count, hence the workspace's size
    kernel = get_kernel(get_spec(op), gemm_static(n, k, groups), m)
    split = kernel.variant.p["split"]
    if split == 1:
        kernel(a, a_scales, b, b_scales, out)
        return out
    tiles = split_tiles(kernel.variant.p, m)
    if tiles > FIXUP_COUNTERS:   # decode_split splits only below the SM count: a GPU of over 1,024 SMs
        raise ValueError(f"fp8_gemm: {tiles} split-K output tiles exceed the workspace's {FIXUP_COUNTERS} counters")
    need = FIXUP_COUNTERS + split * m * gn
    if workspace is None:
        workspace = torch.zeros(need, dtype=torch.float32, device=dev)
    elif workspace.numel() < need:
        raise ValueError(f"workspace: needs >= {need} fp32 elements at {m} tokens ({split} K splits; see "
                         f"fp8_gemm_workspace_numel), got {workspace.numel()}")
    _zero_counters_once(workspace)
    partial = workspace[FIXUP_COUNTERS:need].view(split, m, gn)
    if sums_in_kernel(kernel.variant.p):
        kernel(a, a_scales, b, b_scales, partial, workspace[:FIXUP_COUNTERS].view(torch.int32)[:tiles], out)
    else:
        kernel(a, a_scales, b, b_scales, partial)
        get_kernel(get_spec("fp8_gemm_reduce"), {}, m)(partial, out)
    return out
