"""The vLLM 0.33 attention / indexer peers (benchmarks/peers/vllm_{attention,indexer}.py) import on the CPU
and expose the documented adapters. Skipped when .peers/vllm-0.33.0 is absent (scripts/fetch_peers.sh).
No GPU: nothing launches (without triton the kernels import as placeholders)."""
import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PEERS = ROOT / ".peers" / "vllm-0.33.0"
FILES = ("vllm/v1/attention/ops/rocm_aiter_mla_sparse.py", "vllm/model_executor/layers/indexer_topk.py")

pytestmark = pytest.mark.skipif(
    not all((PEERS / f).is_file() for f in FILES),
    reason=f"{PEERS.relative_to(ROOT)} lacks vLLM 0.33's attention/indexer files: run scripts/fetch_peers.sh")

# The loaders install stub `vllm.*` modules into sys.modules, so they run in a child interpreter to keep
# this process (and the rest of the suite) clean.
_CHECK = r'''
import inspect, sys
sys.path.insert(0, sys.argv[1])
from benchmarks.peers import vllm_attention as pa, vllm_indexer as pi

def params(f):
    return list(inspect.signature(f).parameters)

a = pa.load_peer()
assert params(a.prepare) == ["swa_indices", "swa_lens", "swa_num_slots", "extra_indices", "extra_lens",
                             "extra_num_slots"], params(a.prepare)
assert params(a.decode) == ["q", "swa_cache", "prepared", "attn_sink", "extra_cache", "softmax_scale", "out"]
assert inspect.signature(a.decode).parameters["softmax_scale"].default == 512 ** -0.5
assert params(a.cache_view) == ["pages", "block_size"]
assert params(a.decode_as_vllm_calls_it)[:5] == ["q", "swa_cache", "swa_indices", "swa_lens", "attn_sink"]
ops = a.ops
# the vLLM functions the adapter calls, with the arguments it passes
for name, want in (("_rocm_sparse_attn_decode_ragged_triton", {"q", "main_cache", "main_indices", "main_indptr",
                     "scale", "attn_sink", "nope_head_dim", "rope_head_dim", "extra_cache", "extra_indices",
                     "extra_indptr", "out"}),
                   ("build_ragged_indices_from_dense", {"indices", "lengths", "num_rows"}),
                   ("rocm_sparse_attn_decode", {"q", "kv_cache", "swa_k_cache", "swa_only", "topk_indices",
                     "topk_lens", "swa_indices", "swa_lens", "attn_sink", "scale", "output"}),
                   ("rocm_fp8_paged_mqa_logits_triton", {"q_fp8", "kv_cache_fp8", "weights", "context_lens",
                     "block_tables", "max_model_len"})):
    got = set(params(getattr(ops, name)))
    assert want <= got, (name, want - got)
assert ops._ON_GFX942 is False and ops._ON_GFX950 is False  # the generic Triton path, as on CUDA
assert ops._DSV4_SPARSE_NOPE_DIM == 448 and ops._DSV4_SPARSE_ROPE_DIM == 64
assert pa.page_bytes(256) == 149760 and pa.page_bytes(64) == 37440

i = pi.load_peer()
assert params(i.logits) == ["q_fp8", "weights", "k_cache", "context_lens", "block_tables", "max_model_len"]
assert params(i.topk) == ["logits", "context_lens", "k", "out"]
assert inspect.signature(i.topk).parameters["k"].default == 512
assert i.ops is ops  # one load shared by both adapters

# the torch top-k runs on the CPU: vLLM's own SparseIndexerTopk("torch")
import torch
logits = torch.randn(3, 600)
lens = torch.tensor([600, 100, 0], dtype=torch.int32)
idx = i.topk(logits, lens)
assert idx.shape == (3, 512) and idx.dtype == torch.int32
assert set(idx[0].tolist()) == set(logits[0].topk(512).indices.tolist())
assert (idx[1, 100:] == -1).all() and set(idx[1, :100].tolist()) == set(range(100))
assert (idx[2] == -1).all()

# cache views are views
pages = torch.zeros(4, pa.page_bytes(64), dtype=torch.uint8)
v = a.cache_view(pages, 64)
assert v.shape == (4, 64, 584) and v.stride() == (37440, 584, 1) and v.data_ptr() == pages.data_ptr()
kp = torch.zeros(4, 8640, dtype=torch.uint8)
kv = i.cache_view(kp, 64)
assert kv.shape == (4, 64, 132) and kv.stride(0) == 8640 and kv.data_ptr() == kp.data_ptr()
print("ok")
'''


def test_loaders_import_and_expose_adapters():
    r = subprocess.run([sys.executable, "-c", _CHECK, str(ROOT)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


def test_missing_peers_say_how_to_fetch(tmp_path):
    spec = importlib.util.spec_from_file_location("_pa_missing", ROOT / "benchmarks" / "peers" / "vllm_attention.py")
    before = {m for m in sys.modules if m == "vllm" or m.startswith("vllm.")}
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up; importing it installs no vllm stubs
    try:
        spec.loader.exec_module(mod)
        with pytest.raises(FileNotFoundError, match="fetch_peers.sh"):
            mod.load_peer(tmp_path)
    finally:
        del sys.modules[spec.name]
    assert {m for m in sys.modules if m == "vllm" or m.startswith("vllm.")} == before
    assert "peers_dir" in inspect.signature(mod.load_peer).parameters
