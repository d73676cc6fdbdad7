#!/usr/bin/env bash
# Put the few vLLM 0.33.0 Python files that its mHC path and its Triton sparse-MLA / indexer kernels need
# into .peers/ (ignored by git; never commit them). benchmarks/peers/vllm_{mhc,attention,indexer}.py load
# them without importing the vllm package, so the GPU machine (no internet, no vllm) can time vLLM's own
# kernels.
#
#   bash scripts/fetch_peers.sh                 # pip-downloads the wheel (~340 MB) to a temp dir
#   VLLM_WHEEL=/path/vllm-0.33.0-...whl bash scripts/fetch_peers.sh   # reuse a downloaded wheel
#
# tile-kernels 2.1.0, the other peer, is a plain wheel: it travels in the GPU bundle (.gpu/).
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
version=0.33.0
dest=.peers/vllm-$version
# Runtime closure of kernels/mhc/tilelang.py (pre/post/head and the TileLang prenorm GEMM). Every
# other vllm module those files import is stubbed by benchmarks/peers/vllm_mhc.py (it says why, per stub).
files=(
  vllm/model_executor/kernels/mhc/tilelang.py
  vllm/model_executor/kernels/mhc/tilelang_kernels.py
  vllm/model_executor/warmup/jit_warmup.py
  vllm/model_executor/warmup/jit_warmup_tilelang_helper.py
  vllm/tilelang_utils/__init__.py
  vllm/utils/math_utils.py
  # Runtime closure of benchmarks/peers/vllm_attention.py / benchmarks/peers/vllm_indexer.py. vLLM 0.33 has no Triton DSV4
  # attention or indexer path for SM12x (there it runs FlashInfer's SM120 sparse MLA, DeepGEMM's SM120
  # paged MQA logits and the compiled persistent_topk); its only pure-Python (Triton / torch) ones are
  # the ROCm path's, in this file: the sparse decode over the fp8_ds_mla cache with sink
  # (_rocm_sparse_attn_decode_ragged_triton -> _sparse_attn_decode_ragged_kernel on a non-gfx942/950 GPU)
  # and the paged MQA logits (rocm_fp8_paged_mqa_logits_triton) ...
  vllm/v1/attention/ops/rocm_aiter_mla_sparse.py
  # ... and the indexer's top-k stage (SparseIndexerTopk, backend "torch")
  vllm/model_executor/layers/indexer_topk.py
  # Not loaded, read only (the SM12x path as vLLM 0.33 runs it, for its layouts and index conventions)
  vllm/models/deepseek_v4/nvidia/flashinfer_sparse.py
  vllm/models/deepseek_v4/nvidia/model.py
  vllm/models/deepseek_v4/attention.py
  vllm/models/deepseek_v4/sparse_mla.py
  vllm/models/deepseek_v4/amd/rocm.py
  vllm/models/deepseek_v4/common/ops/cache_utils.py
  vllm/v1/attention/backends/mla/sparse_swa.py
  vllm/v1/kv_cache_interface.py
  vllm/model_executor/layers/sparse_attn_indexer.py
  vllm/utils/deep_gemm.py
  vllm/utils/flashinfer.py
)
stamp=$(printf '%s\n' "$version" "${files[@]}" | sha256sum | cut -c1-16)
if [ "$(cat "$dest/STAMP" 2>/dev/null)" = "$stamp" ]; then
  echo "peers up to date: $dest ($(du -sh .peers | cut -f1))"; exit 0
fi
wheel=${VLLM_WHEEL:-}
tmp=""
if [ -z "$wheel" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # same platform tags as the GPU bundle: the files are pure Python, but vllm ships no py3-none wheel
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d "$tmp" "vllm==$version"
  wheel=$(ls "$tmp"/vllm-"$version"-*.whl)
fi
rm -rf "$dest"
mkdir -p "$dest"
python3 - "$wheel" "$dest" "${files[@]}" <<'PY'
import hashlib, sys, zipfile
from pathlib import Path
wheel, dest, names = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
with zipfile.ZipFile(wheel) as z:
    for n in names:
        (dest / n).parent.mkdir(parents=True, exist_ok=True)
        (dest / n).write_bytes(z.read(n))
h = hashlib.sha256(Path(wheel).read_bytes()).hexdigest()
(dest / "SOURCE").write_text(f"{Path(wheel).name} sha256={h}\n" + "".join(f"{n}\n" for n in names))
PY
echo "$stamp" > "$dest/STAMP"
echo "peers: $dest ($(du -sh .peers | cut -f1)); files: ${#files[@]}"
