"""vLLM 0.33's own Triton sparse MLA decode for DeepSeek V4 (fp8_ds_mla cache, attention sink), loaded
from .peers/ without importing vllm.

What vLLM 0.33 runs where (read in the wheel; .peers/ holds copies, fetched by scripts/fetch_peers.sh):
  SM12x (default and FLASHINFER_MLA_SPARSE_DSV4): DeepseekV4FlashInferSM120Attention
      (vllm/models/deepseek_v4/nvidia/flashinfer_sparse.py) -> flashinfer_trtllm_batch_decode_sparse_mla_dsv4,
      decode and prefill alike. FlashInfer's compiled SM120 kernel; no Triton fallback exists in 0.33 (the
      backend refuses SM12x without it), and it cannot run on an H100/H200.
  SM90/SM100: FlashMLA (DeepseekV4FlashMLAAttention).
  ROCm: DeepseekV4ROCMAiterMLAAttention._forward_decode (vllm/models/deepseek_v4/amd/rocm.py) ->
      rocm_sparse_attn_decode (vllm/v1/attention/ops/rocm_aiter_mla_sparse.py), pure Triton. On a GPU that
      is neither gfx942 nor gfx950 (on CUDA _ON_GFX942 = _ON_GFX950 = False) it takes the "fallback path
      for un-tuned architectures": _rocm_sparse_attn_decode_ragged_triton -> one launch of
      _sparse_attn_decode_ragged_kernel, grid (T, ceil(H/16)), BLOCK_H=16, BLOCK_K=16 (head_dim 512),
      num_warps=8, one pass (no split-K), fp8 dequant in registers, sink applied inside.
This module times that last kernel: vLLM's own Triton kernel for this op, which is also what a Triton
port to SM12x would start from. It is NOT what vLLM runs on SM12x; say so next to any number it makes.

Cache layout the kernel reads (identical to FlashMLA MODEL1_FP8Sparse and to kernels/attention/sparse_mla.py):
  a uint8 tensor of 3 dims [num_pages, block_size, X]; the kernel uses only shape[0], shape[1]
  (= block_size, tokens per page), stride(0) (= page bytes, may include padding) and the base pointer.
  Page p at byte p*stride(0): block_size x 576 B [448 fp8 e4m3 NoPE | 64 bf16 RoPE], then block_size x 8 B
  [7 UE8M0 scales (one per 64 NoPE dims, value 2^(b-127)) | 1 pad]. vLLM allocates [num_pages, block_size,
  584] with the page padded to a multiple of 576 B (MLAAttentionSpec alignment=576), so stride(0) is
  round_up(block_size*584, 576), not block_size*584. cache_view() builds that view from a flat page buffer.
Index convention: a global slot = page * block_size + offset into that cache (the same as ours). vLLM's
  kernel takes each list in ragged (CSR) form: indices [nnz] int32 + indptr [T+1] int32, holes removed.
  Slots < 0 or >= num_pages*block_size are skipped in-kernel. Two lists per token: "main" (the SWA window,
  over the SWA cache) and "extra" (compressed positions over the compressed cache, optional).
  prepare() turns our dense lists ([T, N] int32, -1 holes, lengths [T]) into that form with vLLM's own
  build_ragged_indices_from_dense (2 Triton launches + a torch.cumsum per list): keep it out of the
  timed call. In vLLM the ragged form is built the same way from dense metadata (or fused upstream).
Sink: inside the kernel; l_final = l*e^(m-m') + e^(sink-m'), out = acc*e^(m-m') / l_final (the sink only
  enlarges the denominator; a token with no valid candidate gets out = 0).

Fetch the files first: bash scripts/fetch_peers.sh
"""
from __future__ import annotations

import importlib
import logging
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.peers.stubs import CudaPlatform, stub, stub_packages

VERSION = "0.33.0"
PEERS_DIR = Path(__file__).resolve().parents[2] / ".peers" / f"vllm-{VERSION}"
OPS_FILE = "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"
TOPK_FILE = "vllm/model_executor/layers/indexer_topk.py"

NOPE, ROPE, D = 448, 64, 512
TOKEN_BYTES, SCALE_BYTES = 576, 8
BYTES_PER_TOKEN = TOKEN_BYTES + SCALE_BYTES  # 584
PAGE_ALIGN = 576  # vLLM rounds each fp8_ds_mla page up to a multiple of this

# packages whose real __init__ must not run (vllm/__init__ pulls in the whole engine); each becomes an
# empty package whose __path__ points into .peers, so the fetched submodules import as the real files
_PACKAGES = ("vllm", "vllm.utils", "vllm.v1", "vllm.v1.attention", "vllm.v1.attention.ops",
             "vllm.v1.attention.backends", "vllm.v1.attention.backends.mla", "vllm.v1.worker",
             "vllm.compilation", "vllm.model_executor", "vllm.model_executor.layers")
_mods: dict[str, Any] = {}


def _capability() -> tuple[int, int]:
    """The GPU's compute capability, (0, 0) with none (CPU signature checks)."""
    import torch
    if torch.cuda.is_available():
        return torch.cuda.get_device_capability()
    return (0, 0)


class _CudaPlatform(CudaPlatform):
    """vllm.platforms.current_platform on CUDA, only what the two files ask: rocm_aiter_mla_sparse.py reads
    is_rocm() at import (False -> _ON_GFX942 = _ON_GFX950 = False, the generic Triton path), fp8_dtype()
    (-> OCP e4m3) and is_fp8_fnuz() (False); indexer_topk.py's SparseIndexerTopk.__init__ probes the rest."""

    def fp8_dtype(self):
        import torch
        return torch.float8_e4m3fn

    def is_fp8_fnuz(self) -> bool:
        return False


class _Logger(logging.LoggerAdapter):
    """vllm.logger's logger: the *_once methods the files call."""

    def info_once(self, msg, *a, **k):
        self.info(msg, *a)

    def warning_once(self, msg, *a, **k):
        self.warning(msg, *a)

    def debug_once(self, msg, *a, **k):
        self.debug(msg, *a)


class _Workspace:
    """vllm.v1.worker.workspace's manager, reduced to get_simultaneous: one cached buffer per request
    signature, so a repeated call (the timed loop) allocates nothing, as vLLM's grown workspace does."""

    def __init__(self) -> None:
        self._bufs: dict[Any, list[Any]] = {}

    def get_simultaneous(self, *shapes_and_dtypes):
        import torch
        dev = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        key = (tuple((tuple(s), d) for s, d in shapes_and_dtypes), dev)
        if key not in self._bufs:
            self._bufs[key] = [torch.empty(s, dtype=d, device=dev) for s, d in shapes_and_dtypes]
        return self._bufs[key]


_WORKSPACE = _Workspace()


class _Placeholder:
    """Stands for triton / triton.language when triton is not installed (the CPU test machine): `jit`
    returns the function unchanged and every other attribute is another placeholder, so the files import and
    their Python signatures can be checked. Nothing can launch."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return _Placeholder(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if args and callable(args[0]) and not kwargs:
            return args[0]
        return lambda fn: fn

    def jit(self, fn=None, **_kw):
        return fn if fn is not None else (lambda f: f)


def _not_available(what: str):
    def fail(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError(f"{what} is not available in the vLLM peer (stubbed; see benchmarks/peers/vllm_attention.py)")
    return fail


def _install_stubs(peers: Path) -> None:
    stub_packages(peers, _PACKAGES)   # vllm_mhc may have made some already; same .peers path
    try:
        import triton
        import triton.language as tl
    except ImportError:
        triton, tl = _Placeholder("triton"), _Placeholder("tl")
    # leaf modules the two files import, reduced to what they use:
    # - triton_utils: the real one reads vllm.envs and current_platform and may patch the autotuner; only
    #   `tl` and `triton` are used (placeholders without triton, so the CPU test can import the files)
    stub("vllm.triton_utils", tl=tl, triton=triton, HAS_TRITON=not isinstance(triton, _Placeholder),
          LOG2E=1.4426950408889634, LOGE2=0.6931471805599453)
    # - platforms: current_platform (the real one probes NVML/amdsmi and reads vllm.envs); the ROCm file
    #   imports vllm.platforms.rocm only when is_rocm(), which is False here
    sys.modules.pop("vllm.platforms", None)
    stub("vllm.platforms", current_platform=_CudaPlatform(_capability))
    # - envs: read only inside rocm_aiter_sparse_attn_indexer (the ROCm indexer op, not called)
    stub("vllm.envs")
    # - logger: init_logger with the *_once methods
    stub("vllm.logger", init_logger=lambda name: _Logger(logging.getLogger(name), {}))
    # - compilation.breakable_cudagraph.eager_break_during_capture: decorates the ROCm indexer op
    #   (not called); identity
    stub("vllm.compilation.breakable_cudagraph", eager_break_during_capture=lambda fn: fn)
    # - config / forward_context: read only inside the ROCm indexer op and SparseIndexerTopk(backend=None);
    #   the adapters always pass a backend
    stub("vllm.config", CUDAGraphMode=types.SimpleNamespace(FULL="FULL", NONE="NONE", PIECEWISE="PIECEWISE"),
          get_current_vllm_config=_not_available("vllm.config.get_current_vllm_config"))
    stub("vllm.forward_context", get_forward_context=_not_available("vllm.forward_context.get_forward_context"))
    # - torch_utils.direct_register_custom_op: registers torch.ops.vllm.* for the ROCm indexer and an
    #   MXFP8 BMM (the real module imports vllm.envs, logger, ...); the adapters call Python functions
    stub("vllm.utils.torch_utils", LayerNameType=str, direct_register_custom_op=lambda *a, **k: None,
          _resolve_layer_name=_not_available("vllm.utils.torch_utils._resolve_layer_name"))
    # - backends.mla.indexer.DeepseekV32IndexerMetadata: an isinstance check inside the ROCm indexer op;
    #   the real module imports the whole v1 attention/config stack
    stub("vllm.v1.attention.backends.mla.indexer", DeepseekV32IndexerMetadata=type("DeepseekV32IndexerMetadata", (), {}))
    # - ops.common pack/unpack_seq_triton: MTP padding inside the ROCm indexer op (not called); the real
    #   module pulls in the JIT-warmup machinery
    stub("vllm.v1.attention.ops.common", pack_seq_triton=_not_available("pack_seq_triton"),
          unpack_seq_triton=_not_available("unpack_seq_triton"))
    # - worker.workspace.current_workspace_manager: rocm_fp8_paged_mqa_logits_triton takes its logits
    #   buffer from it; a cached buffer per shape
    stub("vllm.v1.worker.workspace", current_workspace_manager=lambda: _WORKSPACE)
    # - _custom_ops: indexer_topk's "per_row" backend calls the compiled top_k_per_row_decode (not in
    #   the peer); utils.flashinfer.has_flashinfer: False (FlashInfer's top-k is not part of the peer)
    stub("vllm._custom_ops", top_k_per_row_decode=_not_available("vllm._custom_ops.top_k_per_row_decode"))
    stub("vllm.utils.flashinfer", has_flashinfer=lambda: False)


def load_modules(peers_dir: Path | str | None = None) -> dict[str, Any]:
    """Import vLLM's rocm_aiter_mla_sparse.py and indexer_topk.py from .peers (shared by the indexer
    loader). Returns {"ops": ..., "topk": ...}."""
    if _mods:
        return _mods
    peers = Path(peers_dir) if peers_dir else PEERS_DIR
    missing = [f for f in (OPS_FILE, TOPK_FILE) if not (peers / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{peers}: vLLM {VERSION} files missing ({', '.join(missing)}); "
                                "run scripts/fetch_peers.sh")
    _install_stubs(peers)
    _mods["ops"] = importlib.import_module("vllm.v1.attention.ops.rocm_aiter_mla_sparse")
    _mods["topk"] = importlib.import_module("vllm.model_executor.layers.indexer_topk")
    return _mods


def page_bytes(block_size: int) -> int:
    """vLLM's fp8_ds_mla page stride: round_up(block_size * 584, 576)."""
    raw = block_size * BYTES_PER_TOKEN
    return -(-raw // PAGE_ALIGN) * PAGE_ALIGN


@dataclass
class Prepared:
    """Ragged (CSR) candidate lists, as _rocm_sparse_attn_decode_ragged_triton takes them."""
    main_indices: Any            # [nnz_main] int32 global SWA-cache slots, holes removed
    main_indptr: Any             # [T + 1] int32
    extra_indices: Any = None    # [nnz_extra] int32 global compressed-cache slots, or None
    extra_indptr: Any = None     # [T + 1] int32, or None


class AttentionPeer:
    """vLLM 0.33's Triton sparse MLA decode with sink over fp8_ds_mla pages (see the module docstring)."""

    def __init__(self, mods: dict[str, Any]) -> None:
        self.ops = mods["ops"]

    @staticmethod
    def cache_view(pages, block_size: int):
        """uint8 [num_pages, block_size, 584] view (strides (page_bytes, 584, 1)) of a page buffer: any
        uint8 tensor whose dim 0 is the page and stride(0) the page bytes (>= block_size*584, e.g. a flat
        [num_pages, page_bytes] buffer in the layout of kernels/attention/sparse_mla.py). Free (a view)."""
        import torch
        assert pages.dtype == torch.uint8, pages.dtype
        stride0 = pages.stride(0)
        assert stride0 >= block_size * BYTES_PER_TOKEN, (stride0, block_size)
        return torch.as_strided(pages, (pages.shape[0], block_size, BYTES_PER_TOKEN), (stride0, BYTES_PER_TOKEN, 1),
                                pages.storage_offset())

    def prepare(self, swa_indices, swa_lens, swa_num_slots: int, extra_indices=None, extra_lens=None,
                extra_num_slots: int = -1) -> Prepared:
        """Dense lists -> vLLM's ragged form, by vLLM's build_ragged_indices_from_dense (what
        _rocm_sparse_attn_decode_triton runs when it gets dense lists). Not free: run it outside the timed
        call. swa_indices / extra_indices: [T, N] int32 global slots (page*block_size + offset), -1 holes;
        *_lens: [T] int32, entries at or past a token's length are dropped; *_num_slots: num_pages *
        block_size of the cache the list indexes (slots >= it are dropped, as vLLM passes)."""
        build = self.ops.build_ragged_indices_from_dense
        mi, mp = build(swa_indices, swa_lens, num_rows=swa_num_slots)
        if extra_indices is None:
            return Prepared(mi, mp)
        assert extra_lens is not None
        ei, ep = build(extra_indices, extra_lens, num_rows=extra_num_slots)
        return Prepared(mi, mp, ei, ep)

    def decode(self, q, swa_cache, prepared: Prepared, attn_sink, extra_cache=None,
               softmax_scale: float = D ** -0.5, out=None):
        """out [T, H, 512] bf16 = sparse MLA with sink, one launch of vLLM's _sparse_attn_decode_ragged_kernel.

        q [T, H, 512] bf16 (any H; heads run in blocks of 16); swa_cache / extra_cache: cache_view()
        tensors (uint8 [num_pages, block_size, 584], padded page stride allowed; the two may have different
        block sizes); prepared: prepare()'s lists (extra lists iff extra_cache); attn_sink [H] fp32.
        Calls _rocm_sparse_attn_decode_ragged_triton with out given, so the kernel writes `out` itself
        (vLLM's rocm_sparse_attn_decode does that only on gfx950; elsewhere it lets the kernel allocate
        and then copies into its output, one extra [T, H, 512] bf16 copy this adapter leaves out)."""
        has_extra = extra_cache is not None
        assert has_extra == (prepared.extra_indices is not None), "extra_cache needs extra lists in prepare()"
        return self.ops._rocm_sparse_attn_decode_ragged_triton(
            q=q, main_cache=swa_cache, main_indices=prepared.main_indices, main_indptr=prepared.main_indptr,
            scale=softmax_scale, attn_sink=attn_sink, nope_head_dim=NOPE, rope_head_dim=ROPE,
            extra_cache=extra_cache if has_extra else None,
            extra_indices=prepared.extra_indices, extra_indptr=prepared.extra_indptr, out=out)

    def decode_as_vllm_calls_it(self, q, swa_cache, swa_indices, swa_lens, attn_sink, extra_cache=None,
                                extra_indices=None, extra_lens=None, softmax_scale: float = D ** -0.5, out=None):
        """vLLM's public entry rocm_sparse_attn_decode with dense lists, as DeepseekV4ROCMAiterMLAAttention
        calls it when it has no ragged metadata: builds the ragged lists (prepare's work) and copies the
        result into `out` inside the call. Same arguments as prepare + decode; returns out."""
        import torch
        if out is None:
            out = torch.empty_like(q, dtype=torch.bfloat16)
        swa_only = extra_cache is None
        self.ops.rocm_sparse_attn_decode(
            q=q, kv_cache=extra_cache, swa_k_cache=swa_cache, swa_only=swa_only,
            topk_indices=None if swa_only else extra_indices, topk_lens=None if swa_only else extra_lens,
            swa_indices=swa_indices, swa_lens=swa_lens, swa_ragged_indices=None, swa_ragged_indptr=None,
            topk_ragged_indices=None, topk_ragged_indptr=None, attn_sink=attn_sink, scale=softmax_scale,
            head_dim=D, nope_head_dim=NOPE, rope_head_dim=ROPE, output=out)
        return out

    # vLLM's tile parameters on this path (rocm_aiter_mla_sparse.py, _rocm_sparse_attn_decode_ragged_triton)
    TILES = {"kernel": "_sparse_attn_decode_ragged_kernel", "grid": "(T, ceil(H / BLOCK_H))", "BLOCK_H": 16,
             "BLOCK_K": 16, "NOPE_BLOCK": 512, "num_warps": 8, "splits": 1}


def load_peer(peers_dir: Path | str | None = None) -> AttentionPeer:
    """Import the vLLM files from .peers (FileNotFoundError naming scripts/fetch_peers.sh when missing)
    and return the adapter."""
    return AttentionPeer(load_modules(peers_dir))
