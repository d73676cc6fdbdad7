"""Each public op selects each kernel it launches once per call (on the CPU: a counting getter stands in for the
loader, and the launch does nothing). The variant the getter returns is the one the op sizes its outputs from."""
from __future__ import annotations

import collections

import pytest
import torch

from dsv4_jit.arch import get_profile
from dsv4_jit.spec import all_specs, get_spec

SM120 = get_profile("sm_120a")


class _NoLaunch:
    def __init__(self, variant):
        self.variant = variant

    def __call__(self, *args):
        pass


@pytest.fixture
def selects(monkeypatch):
    """kernel name -> how many times its spec's select ran (every registered spec wrapped)."""
    count: collections.Counter = collections.Counter()
    for name, spec in all_specs().items():
        real = spec.select

        def counted(arch, static, num_tokens, _real=real, _name=name):
            count[_name] += 1
            return _real(arch, static, num_tokens)
        monkeypatch.setattr(spec, "select", counted)
    return count


def _get_kernel(spec, static, num_tokens):
    # a getter as serving's: it selects (once) and returns the kernel with its variant
    return _NoLaunch(spec.select(SM120, static, num_tokens))


def test_fp8_gemm_selects_each_kernel_once(selects, cpu_tensors_ok):
    from dsv4_jit.kernels.gemm import fp8_gemm, ops
    n, k = 1536, 4096
    b, sb = torch.zeros(n, k, dtype=torch.float8_e4m3fn), torch.ones(n // 128, k // 128)
    # M = 1: the rows form (no split); M = 16: split-K summed in the GEMM's launch; M = 128 (64-row tiles): the reduce
    # kernel runs behind it
    for m, kernels in ((1, {"fp8_gemm": 3}), (16, {"fp8_gemm": 3}), (128, {"fp8_gemm": 3, "fp8_gemm_reduce": 3})):
        a, sa = torch.zeros(m, k, dtype=torch.float8_e4m3fn), torch.ones(m, k // 128)
        p = get_spec("fp8_gemm").select(SM120, ops.gemm_static(n, k), m).p
        assert p.get("rows", False) == (m == 1)
        assert (p["split"] > 1 and fp8_gemm.sums_in_kernel(p) == (m == 16)) or m == 1
        selects.clear()
        for _ in range(3):
            ops.fp8_gemm(a, sa, b, sb, arch=SM120, get_kernel=_get_kernel)
        assert selects == kernels


def test_sparse_mla_selects_each_kernel_once(selects, cpu_tensors_ok):
    from dsv4_jit.kernels.attention import ops, reference
    t, h, n, pages, bs = 1, 64, 8, 2, 64
    q = torch.zeros(t, h, 512, dtype=torch.bfloat16)
    cache = torch.zeros(pages, reference.page_bytes_for(bs), dtype=torch.uint8)
    idx, lens = torch.zeros(t, n, dtype=torch.int32), torch.full((t,), n, dtype=torch.int32)
    for _ in range(2):
        out = ops.sparse_mla_decode(q, cache, idx, lens, torch.zeros(h), block_size=bs, check_indices=False,
                                    arch=SM120, get_kernel=_get_kernel)
    assert out.shape == (t, h, 512)
    assert selects == {"sparse_mla_fwd": 2, "sparse_mla_combine": 2}   # one token, 64 heads: the split form


def test_moe_ops_select_once(selects, cpu_tensors_ok):
    from dsv4_jit.kernels.moe import ops
    bm = ops.fp4_moe_block_m(128, 256, 1, arch=SM120)
    selects.clear()
    m, e, n, k = 4 * bm, 2, 128, 256
    ops.fp4_moe_gemm(torch.zeros(m, k, dtype=torch.float8_e4m3fn), torch.ones(m, k // 128),
                     torch.zeros(e, n, k // 2, dtype=torch.uint8), torch.zeros(e, n, k // 32, dtype=torch.uint8),
                     torch.zeros(m // bm, dtype=torch.int32), num_tokens=1, arch=SM120, get_kernel=_get_kernel)
    ops.moe_route(torch.zeros(3, 256), topk=6, bias=torch.zeros(256), arch=SM120, get_kernel=_get_kernel)
    ops.moe_combine(torch.zeros(32, 64, dtype=torch.bfloat16), torch.zeros(18, dtype=torch.int32), torch.zeros(3, 6),
                    arch=SM120, get_kernel=_get_kernel)
    assert selects == {"fp4_moe_gemm": 1, "moe_route": 1, "moe_combine": 1}


def test_mhc_post_ops_select_once(selects, cpu_tensors_ok):
    from dsv4_jit.kernels.mhc import ops
    from dsv4_jit.kernels.mhc.post import fused_num_splits
    t, hc, hidden, mix = 3, 4, 4096, 24
    x, res = torch.zeros(t, hidden, dtype=torch.bfloat16), torch.zeros(t, hc, hidden, dtype=torch.bfloat16)
    post, comb = torch.zeros(t, hc), torch.zeros(t, hc, hc)
    out, mix_part, sq_part = ops.mhc_post_pre_fused(x, res, post, comb, torch.zeros(mix, hc * hidden), arch=SM120,
                                                    get_kernel=_get_kernel)
    ops.hc_head(res, torch.zeros(hc, hc * hidden), torch.ones(1), torch.zeros(hc), rms_eps=1e-6, hc_eps=1e-6,
                arch=SM120, get_kernel=_get_kernel)
    assert selects == {"mhc_post_pre_fused": 1, "mhc_head": 1}
    # the partials are sized from the variant the getter returned
    v = all_specs()["mhc_post_pre_fused"].select(SM120, {"hidden_size": hidden, "hc_mult": hc, "mix_width": mix}, t)
    assert mix_part.shape == (fused_num_splits(v), t, v.p["mix_pad"]) and sq_part.shape == (fused_num_splits(v), t)


def test_quant_op_selects_once(selects, cpu_tensors_ok):
    from dsv4_jit.kernels.quant import ops
    ops.act_quant_fp8(torch.zeros(3, 256, dtype=torch.bfloat16), arch=SM120, get_kernel=_get_kernel)
    assert selects == {"act_quant_fp8": 1}


def test_fp8_gemm_zeroes_a_workspace_s_counters_on_its_first_use_only(cpu_tensors_ok):
    from dsv4_jit.kernels.gemm import ops
    m, n, k = 16, 1536, 4096   # split-K, summed in the GEMM's launch
    a, sa = torch.zeros(m, k, dtype=torch.float8_e4m3fn), torch.ones(m, k // 128)
    b, sb = torch.zeros(n, k, dtype=torch.float8_e4m3fn), torch.ones(n // 128, k // 128)
    ws = torch.full((ops.fp8_gemm_workspace_numel(n, k, m, arch=SM120),), float("nan"))
    ops.fp8_gemm(a, sa, b, sb, arch=SM120, get_kernel=_get_kernel, workspace=ws)
    assert not ws[:ops.FIXUP_COUNTERS].view(torch.int32).any() and ws[ops.FIXUP_COUNTERS:].isnan().all()
    ws[:ops.FIXUP_COUNTERS].view(torch.int32)[0] = 7   # the kernel keeps them zero: no second memset
    ops.fp8_gemm(a, sa, b, sb, arch=SM120, get_kernel=_get_kernel, workspace=ws)
    assert int(ws[:ops.FIXUP_COUNTERS].view(torch.int32)[0]) == 7
