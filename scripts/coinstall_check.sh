#!/usr/bin/env bash
# dsv4-jit beside vLLM 0.33.0's pins, on a machine with a package index (no GPU needed):
#
#   bash scripts/coinstall_check.sh [VENV_DIR]
#
# 1. pip's resolver on `dsv4-jit[vllm]` together with vllm==0.33.0 (a dry run; VLLM_WHEEL=/path/vllm-0.33.0-*.whl
#    reuses a downloaded wheel): it must resolve, onto vLLM's tilelang, apache-tvm-ffi and torch pins;
# 2. a fresh venv holding vLLM 0.33.0's pins of what dsv4-jit shares (tilelang==0.1.12, apache-tvm-ffi==0.1.11;
#    torch as $TORCH_SPEC, default the CPU build torch==2.13.0 since vLLM's torch==2.14.0 is a multi-GB CUDA
#    build), then a plain `pip install` of this checkout: nothing pinned moves, `pip check` is clean, the vLLM
#    plugin entry point is registered, and dsv4_jit imports;
# 3. in that venv, with no GPU: one kernel compiled with TileLang 0.1.12 into a cache, exported as a bundle,
#    imported into an empty cache and loaded there by a fresh, sealed process with zero compiles.
# scripts/gpu_coinstall_check.py is the GPU half (the kernels run against the reference from the bundle).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$(mktemp -d)/venv}
torch_spec=${TORCH_SPEC:-torch==2.13.0}
vllm=${VLLM_WHEEL:-vllm==0.33.0}
export PIP_DISABLE_PIP_VERSION_CHECK=1

echo "== 1. resolve dsv4-jit[vllm] with $vllm"
report=$(mktemp)
python3 -m pip install -q --dry-run --ignore-installed --report "$report" "$root[vllm]" "$vllm" 2>&1 \
  | grep -v '^WARNING: Location' || true
python3 - "$report" <<'EOF'
import json, sys
got = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.load(open(sys.argv[1]))["install"]}
want = {"vllm": "0.33.0", "tilelang": "0.1.12", "apache-tvm-ffi": "0.1.11", "torch": "2.14.0"}
print(f"resolved {len(got)} packages:", {k: got.get(k) for k in ["dsv4-jit", *want]})
bad = {k: got.get(k) for k, v in want.items() if got.get(k) != v}
sys.exit(f"FAIL: not vLLM's pins: {bad}" if bad or "dsv4-jit" not in got else 0)
EOF

echo "== 2. install into a venv holding vLLM 0.33.0's pins ($venv)"
python3 -m venv "$venv"
py=$venv/bin/python
"$py" -m pip install -q "$torch_spec"
"$py" -m pip install -q tilelang==0.1.12 apache-tvm-ffi==0.1.11
before=$("$py" -m pip freeze | grep -iE '^(tilelang|apache-tvm-ffi|torch)==' | sort)
"$py" -m pip install -q "$root"
after=$("$py" -m pip freeze | grep -iE '^(tilelang|apache-tvm-ffi|torch)==' | sort)
echo "$after"
[ "$before" = "$after" ] || { echo "FAIL: the install moved a pin: $before -> $after"; exit 1; }
"$py" -m pip check
cd "$(mktemp -d)"   # import the installed copy, not the checkout
"$py" - <<'EOF'
from importlib import metadata
eps = [e for e in metadata.entry_points(group="vllm.general_plugins") if e.name == "dsv4_jit"]
assert eps, "vllm.general_plugins entry point dsv4_jit is not registered"
print("vLLM plugin entry point:", eps[0].value, "->", eps[0].load())
EOF

echo "== 3. compile, export, import, load sealed with zero compiles (TileLang 0.1.12, no GPU)"
work=$(mktemp -d)
"$py" "$root/scripts/coinstall_load_check.py" compile "$work/build" "$work/bundle.tar.gz"
DSV4_JIT_CACHE_DIR=$work/serve "$py" -m dsv4_jit cache import "$work/bundle.tar.gz" --cache-dir "$work/serve"
"$py" "$root/scripts/coinstall_load_check.py" load "$work/serve"
echo "OK"
