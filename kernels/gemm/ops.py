"""FP8 block-scaled GEMM host op: validate every argument (ValueError naming it) before anything is selected,
loaded or compiled (the workspace's size, which the variant's split count fixes, before the launch); allocate
only what the caller did not pass (`out=`, `workspace=` for CUDA-graph capture); launch the variant `select`
picked, then (split-K variants) the reduction.

  a         torch.float8_e4m3fn [M, G*K]      activations (act_quant_fp8 output)
  a_scales  fp32 [M, G*K/128]                 per-token 1x128 scales (powers of two)
  b         torch.float8_e4m3fn [G*N, K]      weight(s) as stored (row n = output feature), G stacked for groups
  b_scales  fp32 [G*ceil(N/128), K/128]       128x128 block scales (the checkpoint's float8_e8m0fnu `scale`
            converted once at load: `scale.float()`)
  out       bf16 [M, G*N]
  workspace fp32, 1-D, >= fp8_gemm_workspace_numel(...) elements (split-K partials; only read when the
            variant splits, i.e. M <= 256 and the weight alone would not fill the GPU)
"""
from __future__ import annotations

from dsv4_jit.arch import check_arch
from dsv4_jit.spec import get_spec
from dsv4_jit.validate import int_arg

QBLOCK = 128


def gemm_static(n: int, k: int, groups: int = 1) -> dict:
    """The static dict of fp8_gemm (exactly what family.uses declares per weight shape)."""
    return {"n": n, "k": k, "groups": groups}


def fp8_gemm_workspace_numel(n: int, k: int, num_tokens: int, *, arch, groups: int = 1) -> int:
    """fp32 elements of the split-K workspace at this token count (0 when the variant does not split)."""
    if num_tokens < 1:
        return 0
    p = get_spec("fp8_gemm").select(check_arch("fp8_gemm", arch), gemm_static(n, k, groups), num_tokens).p
    return 0 if p["split"] == 1 else p["split"] * num_tokens * groups * n


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
    need = split * m * gn
    if workspace is None:
        workspace = torch.empty(need, dtype=torch.float32, device=dev)
    elif workspace.numel() < need:
        raise ValueError(f"workspace: needs >= {need} fp32 elements at {m} tokens ({split} K splits; see "
                         f"fp8_gemm_workspace_numel), got {workspace.numel()}")
    partial = workspace[:need].view(split, m, gn)
    kernel(a, a_scales, b, b_scales, partial)
    get_kernel(get_spec("fp8_gemm_reduce"), {}, m)(partial, out)
    return out
