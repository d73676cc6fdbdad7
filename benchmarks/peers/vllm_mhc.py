"""vLLM 0.33's own mHC path when DeepGEMM is unavailable, loaded from .peers/ without importing vllm.

What vLLM's DeepSeek-V4 model (vllm/models/deepseek_v4/nvidia/model.py) calls, all from
vllm/model_executor/kernels/mhc/tilelang.py, as plain Python functions (not through torch.ops):
  pre : mhc_pre_tilelang(residual, fn, hc_scale, hc_base, rms_eps, hc_eps, hc_eps, 2.0, iters,
        norm_weight=attn_norm.weight, norm_eps=...)  (first layer; later layers fuse post + pre)
        -> _hc_prenorm_gemm_outputs: is_deep_gemm_supported() False -> n_splits=1 and the TileLang
           GEMV _HC_PRENORM_GEMM_TILELANG_KERNEL (hc_prenorm_gemm_tilelang; block_m variant at T>=1024,
           1024 threads x tile_n 4 at T<128), then _MHC_PRE_BIG_FUSE_TILELANG_KERNEL
           (mhc_pre_big_fuse_tilelang, or ..._with_norm_tilelang when norm_weight is given)
  post: mhc_post_tilelang(x, residual, post_mix, comb_mix)  (after the last layer)
  head: hc_head_fused_kernel_tilelang(residual, hc_head_fn, hc_head_scale, hc_head_base, rms_eps, hc_eps)
Caveat: the stock 0.33 wheel vendors DeepGEMM with an SM120 tf32_hc_prenorm_gemm and its
platform.support_deep_gemm() includes capability family 120, so on SM12x it takes the DeepGEMM GEMM
with split-K unless VLLM_USE_DEEP_GEMM=0. This module times the no-DeepGEMM path (the only one that
runs without vLLM's compiled extension).

Fetch the files first: bash scripts/fetch_peers.sh
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from benchmarks.peers.stubs import CudaPlatform, stub, stub_packages

VERSION = "0.33.0"
PEERS_DIR = Path(__file__).resolve().parents[2] / ".peers" / f"vllm-{VERSION}"

# packages whose real __init__ must not run (vllm/__init__ pulls in the whole engine and its deps;
# kernels/mhc/__init__ imports the aiter/cpu/triton backends); each becomes an empty package whose
# __path__ points into .peers, so the fetched submodules import as the real files
_PACKAGES = ("vllm", "vllm.model_executor", "vllm.model_executor.kernels", "vllm.model_executor.kernels.mhc",
             "vllm.model_executor.warmup", "vllm.utils")
_assume_cc: tuple[int, int] | None = None
_mods: dict[str, Any] = {}


def _capability() -> tuple[int, int]:
    """The GPU's compute capability; `assume_cc` (load's argument) when cross-compiling with no GPU."""
    if _assume_cc is not None:
        return _assume_cc
    import torch
    return torch.cuda.get_device_capability()


class _CudaPlatform(CudaPlatform):
    """vllm.platforms.current_platform on CUDA: only what the mHC files ask (tilelang_kernels.py reads
    is_arch_support_pdl at import -> ENABLE_PDL; tilelang_utils picks eager tilelang.jit on CUDA)."""

    def is_arch_support_pdl(self) -> bool:  # vllm/platforms/cuda.py: major >= 9
        return self._capability()[0] >= 9


def _no_deep_gemm(*_a: Any, **_k: Any) -> Any:
    raise RuntimeError("DeepGEMM is not available in this peer (the SM12x no-DeepGEMM path was asked for)")


def _install_stubs(peers: Path) -> None:
    stub_packages(peers, _PACKAGES)
    # leaf modules the mHC files import, reduced to what they use:
    # - platforms: current_platform (the real one probes NVML/amdsmi and reads vllm.envs)
    stub("vllm.platforms", current_platform=_CudaPlatform(_capability))
    # - import_utils.has_tilelang: tilelang_utils checks it before importing tilelang
    import importlib.util
    stub("vllm.utils.import_utils", has_tilelang=lambda: importlib.util.find_spec("tilelang") is not None)
    # - torch_utils.direct_register_custom_op: registers torch.ops.vllm.*; the model calls the Python
    #   functions directly, so registration is skipped (the real module imports vllm.envs, logger, ...)
    stub("vllm.utils.torch_utils", direct_register_custom_op=lambda *a, **k: None)
    # - deep_gemm: unavailable, which selects the TileLang prenorm GEMM with n_splits=1
    stub("vllm.utils.deep_gemm", is_deep_gemm_supported=lambda: False, tf32_hc_prenorm_gemm=_no_deep_gemm)


def load(peers_dir: Path | str | None = None, assume_cc: tuple[int, int] | None = None) -> None:
    """Import vLLM's mHC TileLang modules from .peers. `assume_cc` stands in for the GPU when there is
    none (cross-compiling): vLLM decides PDL from it at import, as it does from the GPU."""
    global _assume_cc
    if _mods:
        return
    peers = Path(peers_dir) if peers_dir else PEERS_DIR
    if not (peers / "vllm/model_executor/kernels/mhc/tilelang.py").is_file():
        raise FileNotFoundError(f"{peers}: vLLM {VERSION} files missing (run scripts/fetch_peers.sh)")
    _assume_cc = assume_cc
    _install_stubs(peers)
    import importlib
    _mods["ops"] = importlib.import_module("vllm.model_executor.kernels.mhc.tilelang")
    _mods["kernels"] = importlib.import_module("vllm.model_executor.kernels.mhc.tilelang_kernels")


def _ops() -> Any:
    if not _mods:
        load()
    return _mods["ops"]


def pre(residual, fn, hc_scale, hc_base, rms_eps: float = 1e-6, hc_eps: float = 1e-6, sinkhorn_iters: int = 20,
        post_mult: float = 2.0, norm_weight=None, norm_eps: float = 1e-6):
    """(layer_input [T,H] bf16, post [T,hc] f32, comb [T,hc,hc] f32), as vLLM's first-layer hc_pre
    (the model passes norm_weight = attn_norm.weight; None gives the plain big fuse)."""
    post, comb, layer_input = _ops().mhc_pre_tilelang(
        residual, fn, hc_scale, hc_base, rms_eps, hc_eps, hc_eps, post_mult, sinkhorn_iters,
        norm_weight=norm_weight, norm_eps=norm_eps)
    return layer_input, post.view(post.shape[0], -1), comb


def post(x, residual, post_mix, comb_mix):
    """out [T,hc,H] bf16 = post * x + comb^T residual (vLLM's hc_post after the last layer)."""
    return _ops().mhc_post_tilelang(x, residual, post_mix, comb_mix)


def head(residual, fn, hc_scale, hc_base, rms_eps: float = 1e-6, hc_eps: float = 1e-6):
    """y [T,H] bf16 (vLLM's fused hc_head, one kernel)."""
    return _ops().hc_head_fused_kernel_tilelang(residual, fn, hc_scale, hc_base, rms_eps, hc_eps)


def prenorm_gemm(x, fn, hidden_size: int, hc_mult: int, n_splits: int = 1):
    """(x @ fn^T [n_splits, T, N] f32, sum x^2 [n_splits, T] f32) by vLLM's TileLang GEMV, split over K.
    Needs (hc_mult*hidden_size / n_splits) % 512 == 0 when n_splits > 1 (its 512 threads per split)."""
    import torch
    t = x.shape[0]
    out = torch.empty(n_splits, t, fn.shape[0], dtype=torch.float32, device=x.device)
    sqrsum = torch.empty(n_splits, t, dtype=torch.float32, device=x.device)
    if not _mods:
        load()
    _mods["kernels"]._HC_PRENORM_GEMM_TILELANG_KERNEL(x, fn, out, sqrsum, hidden_size, hc_mult, n_splits=n_splits)
    return out, sqrsum


def max_gemm_splits(hc_hidden: int, want: int) -> int:
    """Largest power of two <= want that prenorm_gemm accepts for K = hc_hidden."""
    s = 1
    while s * 2 <= want and hc_hidden % (s * 2 * 512) == 0:
        s *= 2
    return s


def jit_kernels() -> dict[str, Callable[..., Any]]:
    """The tilelang.jit objects behind pre/post/head (for cross-compiling with no GPU)."""
    if not _mods:
        load()
    k = _mods["kernels"]
    return {name: getattr(k, name) for name in (
        "hc_prenorm_gemm_tilelang", "hc_prenorm_gemm_block_m_tilelang", "mhc_pre_big_fuse_tilelang",
        "mhc_pre_big_fuse_with_norm_tilelang", "mhc_post_tilelang", "hc_head_fuse_tilelang")}


def cross_compile(arch: str, hidden: int, tokens: list[int], gemm_splits: list[int], hc: int = 4,
                  eps: float = 1e-6, iters: int = 20, post_mult: float = 2.0, peers_dir: Path | str | None = None,
                  log: Callable[[str], None] = print) -> int:
    """Compile, with no GPU, every variant pre/post/head select for `tokens` (plus the split-K GEMMs in
    `gemm_splits`) for `arch` ("sm_90a"), through vLLM's own compile-only warmup (no launch). Returns the count."""
    import time
    cc = int(arch.removeprefix("sm_").rstrip("af"))
    load(peers_dir, assume_cc=(cc // 10, cc % 10))
    for impl in jit_kernels().values():
        impl.target = {"kind": "cuda", "arch": arch}
    k = _mods["kernels"]
    gemm, fuse = k._HC_PRENORM_GEMM_TILELANG_KERNEL, k._MHC_PRE_BIG_FUSE_TILELANG_KERNEL
    keys: list[tuple[Any, Any]] = []
    for n_out in (hc * (2 + hc), hc):  # pre's mixes; hc_head's mixes (the tile-kernels head GEMM)
        for t in tokens:
            keys.append((gemm, gemm.dispatch(num_tokens=t, hc_hidden_size=hc * hidden, hidden_size=hidden,
                                             hc_mult=hc, n_out=n_out)))
    for s in gemm_splits:
        keys.append((gemm, gemm.dispatch(num_tokens=1, hc_hidden_size=hc * hidden, hidden_size=hidden, hc_mult=hc,
                                         n_out=hc * (2 + hc), n_splits=s)))
    for norm in (False, True):
        keys.append((fuse, fuse.dispatch(hidden_size=hidden, hc_mult=hc, n_splits=1, is_broadcast=False,
                                         use_norm_weight=norm, rms_eps=eps, hc_pre_eps=eps, hc_sinkhorn_eps=eps,
                                         hc_post_mult_value=post_mult, sinkhorn_repeat=iters, norm_eps=eps)))
    post_k, head_k = k._MHC_POST_TILELANG_KERNEL, k._HC_HEAD_FUSED_TILELANG_KERNEL
    keys.append((post_k, post_k.CompileKey(hidden_size=hidden, hc_mult=hc)))
    keys.append((head_k, head_k.CompileKey(hidden_size=hidden, hc_mult=hc, rms_eps=eps, hc_eps=eps)))
    done = set()
    for owner, key in keys:
        if key in done:
            continue
        done.add(key)
        t0 = time.time()
        owner.compile(key)
        log(f"  vllm {arch} {time.time() - t0:5.1f}s {key}")
    return len(done)
