"""vLLM 0.33's own Triton paged MQA logits (the lightning indexer's scores) and its torch top-k, loaded from
.peers/ without importing vllm.

What vLLM 0.33 runs where (vllm/model_executor/layers/sparse_attn_indexer.py, sparse_attn_indexer, decode):
  CUDA, SM12x included: vllm.utils.deep_gemm.fp8_fp4_paged_mqa_logits -> the DeepGEMM vendored in the
      wheel (vllm/third_party/deep_gemm, compiled, SM120 kernels; page size 64 only on SM120, see
      deep_gemm.get_paged_mqa_page_sizes), then top-k by SparseIndexerTopk (vllm/model_executor/layers/
      indexer_topk.py): "auto" -> cooperative_topk is refused on SM12x -> persistent_topk (compiled
      torch.ops._C, topk in {512, 1024, 2048}). No Triton/torch fallback exists for SM12x in 0.33.
  ROCm, C4A indexer on gfx942/gfx950: rocm_fp8_paged_mqa_logits (vllm/v1/attention/ops/
      rocm_aiter_mla_sparse.py) -> rocm_fp8_paged_mqa_logits_triton, pure Triton:
      _fp8_paged_mqa_logits_decode_kernel, grid (rows, N_SPLITS), BLOCK_KV=64 (must divide the page),
      N_SPLITS = max(1, min(num_SMs, ceil(max_model_len/64), 1024 // rows)), num_warps=4, num_stages=2;
      one tile = 64 positions of one page, tl.dot(fp8 K [64,128], fp8 q^T [128,H]) -> relu -> * w -> sum
      over heads -> * k_scale.
This module times that Triton kernel and SparseIndexerTopk's "torch" backend (vLLM's reference: mask past
the row end, torch.topk, -1 fill). Neither is what vLLM runs on SM12x; say so next to any number.

Index-K cache layout the kernel reads (FP8; the same bytes DeepGEMM's paged MQA reads on CUDA):
  page p = [block_size x 128 fp8 e4m3 values][block_size x 4 B fp32 scales] ("block-flat": all values
  first, then all scales; NOT 132 B interleaved per token). 132 B/token. vLLM's tensor is uint8
  [num_pages, block_size, 132] (DeepGEMM's view adds a 1: [num_pages, block_size, 1, 132]); block_size =
  cache block_size / compress_ratio = 256 / 4 = 64 entries by default, one entry per 4 tokens. With
  --kv-cache-dtype fp8_ds_mla vLLM pads each page to a multiple of 576 B (64*132 = 8448 -> 8640); the
  kernel takes the page stride, but vLLM's wrapper reshapes the cache to [num_pages, -1], which is a
  view only for unpadded pages, so logits() launches the same kernel with the wrapper's parameters itself
  when the pages are padded (documented there).
Query: fp8 e4m3 [B, next_n, 64, 128]; per-(token, head) fp32 weights [B*next_n, 64] (vLLM folds the
  indexer's softmax scale, 64^-0.5 and q's per-token power-of-two fp8 scale into them; see
  mqa_logits_mx_inputs in vllm/utils/deep_gemm.py). context_lens [B] int32, in index-K entries.
  block_tables [B, max_blocks] int32, per request (a request's entry j is at page block_tables[b, j // bs],
  offset j % bs). Output: fp32 logits [B*next_n, max_model_len] (a reused workspace; columns at or past a
  row's length are NOT written). Top-k indices are positions into the request's index-K (0..len-1),
  int32, -1 past the row's length; the attention maps them to global slots later
  (compute_global_topk_indices_and_lens, vllm/models/deepseek_v4/common/ops/cache_utils.py).

Fetch the files first: bash scripts/fetch_peers.sh
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

INDEX_HEADS, INDEX_DIM, INDEX_TOPK = 64, 128, 512
K_BYTES = INDEX_DIM + 4  # 132
BLOCK_KV = 64  # rocm_fp8_paged_mqa_logits_triton


def _attention_loader():
    """vllm_attention (the shared stubs and module loading), imported by path next to this file, under its package
    name so that an import of benchmarks.peers.vllm_attention gets the same module."""
    mod = sys.modules.get("benchmarks.peers.vllm_attention")
    if mod is None:
        path = Path(__file__).resolve().with_name("vllm_attention.py")
        spec = importlib.util.spec_from_file_location("benchmarks.peers.vllm_attention", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["benchmarks.peers.vllm_attention"] = mod
        spec.loader.exec_module(mod)
    return mod


class IndexerPeer:
    """vLLM 0.33's Triton paged MQA logits + torch top-k (see the module docstring)."""

    def __init__(self, mods: dict[str, Any]) -> None:
        self.ops = mods["ops"]
        self.topk_mod = mods["topk"]
        self._topk = None

    @staticmethod
    def cache_view(pages, block_size: int):
        """uint8 [num_pages, block_size, 132] view of a page buffer whose dim 0 is the page, stride(0) the
        page bytes (>= block_size*132; vLLM's own allocation pads to a multiple of 576 with fp8_ds_mla),
        holding [block_size x 128 fp8][block_size x 4 B fp32]. Free (a view)."""
        import torch
        assert pages.dtype == torch.uint8, pages.dtype
        stride0 = pages.stride(0)
        assert stride0 >= block_size * K_BYTES and stride0 % 4 == 0, (stride0, block_size)
        return torch.as_strided(pages, (pages.shape[0], block_size, K_BYTES), (stride0, K_BYTES, 1),
                                pages.storage_offset())

    def logits(self, q_fp8, weights, k_cache, context_lens, block_tables, max_model_len: int):
        """fp32 logits [T, max_model_len] (columns >= context_lens[t] unwritten) for decode (next_n = 1).

        q_fp8 [T, 64, 128] float8_e4m3fn (viewed as [T, 1, 64, 128], free); weights [T, 64] fp32;
        k_cache: cache_view() tensor (block_size % 64 == 0); context_lens [T] int32 (index-K entries
        visible to token t); block_tables [T, max_blocks] int32; max_model_len: logits width (vLLM: the
        model's max_model_len // 4). Unpadded pages: vLLM's rocm_fp8_paged_mqa_logits_triton itself.
        Padded pages: that function's reshape would copy the whole cache, so this launches its kernel
        _fp8_paged_mqa_logits_decode_kernel directly with the wrapper's exact arguments and page strides."""
        q4 = q_fp8.view(q_fp8.shape[0], 1, q_fp8.shape[1], q_fp8.shape[2])
        bs = k_cache.shape[1]
        assert bs % BLOCK_KV == 0, f"vLLM's Triton paged MQA logits needs block_size % {BLOCK_KV} == 0, got {bs}"
        if k_cache.stride(0) == bs * K_BYTES and k_cache.is_contiguous():
            return self.ops.rocm_fp8_paged_mqa_logits_triton(q4, k_cache, weights, context_lens, block_tables,
                                                             max_model_len)
        return self._logits_padded(q4, weights, k_cache, context_lens, block_tables, max_model_len)

    def _logits_padded(self, q4, weights, k_cache, context_lens, block_tables, max_model_len: int):
        # mirrors rocm_fp8_paged_mqa_logits_triton line for line except the reshape (pages keep their stride)
        import torch
        ops = self.ops
        batch_size, next_n, num_heads, head_size = q4.shape
        bs = k_cache.shape[1]
        stride0 = k_cache.stride(0)
        base = torch.as_strided(k_cache, (k_cache.shape[0], stride0), (stride0, 1), k_cache.storage_offset())
        kv_val = base.view(ops.FP8_DTYPE)
        kv_scale = base.view(torch.float32)
        cl = context_lens.reshape(-1)
        ctx_per_row = not (next_n > 1 and cl.numel() == batch_size)
        (out,) = ops.current_workspace_manager().get_simultaneous(((batch_size * next_n, max_model_len), torch.float32))
        rows = batch_size * next_n
        tiles_cap = (max_model_len + BLOCK_KV - 1) // BLOCK_KV
        n_splits = max(1, min(max(1, ops._decode_cu_count()), tiles_cap, 1024 // rows))
        ops._fp8_paged_mqa_logits_decode_kernel[(rows, n_splits)](
            q4, kv_val, kv_scale, weights, cl, block_tables, out,
            q4.stride(0), q4.stride(1), q4.stride(2), weights.stride(0), kv_val.stride(0), kv_scale.stride(0),
            (bs * head_size) // 4, block_tables.stride(0), out.stride(0), block_tables.shape[1], max_model_len,
            NUM_HEADS=num_heads, HEAD_SIZE=head_size, BLOCK_SIZE=bs, BLOCK_KV=BLOCK_KV, N_SPLITS=n_splits,
            NEXT_N=next_n, CTX_PER_ROW=ctx_per_row, num_warps=4, num_stages=2)
        return out

    def topk(self, logits, context_lens, k: int = INDEX_TOPK, out=None):
        """int32 [T, k] positions of the k largest logits in [0, context_lens[t]), -1 past the length,
        by vLLM's SparseIndexerTopk with backend "torch" (in vLLM an opt-in reference backend: mask,
        torch.topk, so the row comes out sorted by descending logit). Needs logits.shape[1] >= k (vLLM's
        logits width is max_model_len // 4)."""
        import torch
        if self._topk is None:
            self._topk = self.topk_mod.SparseIndexerTopk("torch")
        if out is None:
            out = torch.empty(logits.shape[0], k, dtype=torch.int32, device=logits.device)
        lens = context_lens.reshape(-1).to(torch.int32)
        self._topk(logits, lens, 1, out, k, int(logits.shape[1]))
        return out

    # vLLM's tile parameters on this path (rocm_fp8_paged_mqa_logits_triton)
    TILES = {"kernel": "_fp8_paged_mqa_logits_decode_kernel", "grid": "(T * next_n, N_SPLITS)", "BLOCK_KV": 64,
             "N_SPLITS": "max(1, min(num_SMs, ceil(max_model_len / 64), 1024 // rows))", "num_warps": 4,
             "num_stages": 2}


def load_peer(peers_dir: Path | str | None = None) -> IndexerPeer:
    """Import the vLLM files from .peers (FileNotFoundError naming scripts/fetch_peers.sh when missing)
    and return the adapter."""
    return IndexerPeer(_attention_loader().load_modules(peers_dir))
