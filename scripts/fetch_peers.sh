#!/usr/bin/env bash
# Put the few vLLM 0.33.0 Python files that its mHC path needs into .peers/ (ignored by git; never
# commit them). benchmarks/peer_vllm_mhc.py loads them without importing the vllm package, so the
# GPU machine (no internet, no vllm) can time vLLM's own TileLang mHC kernels.
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
# other vllm module those files import is stubbed by peer_vllm_mhc.py (it says why, per stub).
files=(
  vllm/model_executor/kernels/mhc/tilelang.py
  vllm/model_executor/kernels/mhc/tilelang_kernels.py
  vllm/model_executor/warmup/jit_warmup.py
  vllm/model_executor/warmup/jit_warmup_tilelang_helper.py
  vllm/tilelang_utils/__init__.py
  vllm/utils/math_utils.py
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
