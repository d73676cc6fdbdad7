"""Warm path: a fresh process getting callable kernels from our store vs TileLang's own disk-cache hit.

Both sides start in a fresh Python process with `torch`, `tilelang` and `dsv4_jit` already imported
(process start-up is the same for both and reported separately). Timed: from there until every kernel
of the op is callable (and, with a GPU, has been launched once and synchronised).

  * tilelang: `tilelang.compile(prim_func)` hitting TileLang's disk cache (it still elaborates the
    Python DSL and hashes the TIR script before it finds the entry);
  * ours:     `dsv4_jit.jit.load(spec, variant)` (source-fingerprint key -> manifest -> dlopen).

    python benchmarks/cache/bench_warm_load.py --out bench_out/warm_load.json [--repeat 5]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, os, sys, time
t_start = time.perf_counter()
import torch, tilelang, dsv4_jit
from dsv4_jit import jit
from dsv4_jit.kernels import op_variants as variants_for_op
t_imports = time.perf_counter() - t_start
mode, op, T = sys.argv[1], sys.argv[2], int(sys.argv[3])
pairs = variants_for_op(op, T)
# One-time per process for us (engine start): store open + toolchain fingerprint; reported apart.
t_prepare = jit.prepare() if mode == "ours" else 0.0
gpu = torch.cuda.is_available()

def tensors_for(meta, variant):
    p = variant.p
    out = []
    for a in meta["signature"]:
        if "scalar" in a:
            out.append(1); continue
        shape = [T if s == "num_tokens" else (int(s) if isinstance(s, int) else p.get(s, p.get("n_splits", 1)))
                 for s in a["shape"]]
        out.append(torch.zeros(shape, dtype=getattr(torch, a["dtype"]), device="cuda"))
    return out

# Launch arguments are prepared before the clock starts (from the stored signature; no module load).
args = [tensors_for(jit.lookup(spec, variant).extra, variant) if gpu else None for spec, variant in pairs]
if gpu:
    torch.cuda.synchronize()
t0 = time.perf_counter()
launched = 0
for (spec, variant), a in zip(pairs, args):
    if mode == "tilelang":
        prof = dsv4_jit.get_profile(variant.arch)
        k = tilelang.compile(spec.build(variant), target=prof.target, execution_backend="tvm_ffi",
                             pass_configs=spec.pass_configs(variant))
    else:
        k = jit.load(spec, variant, compile_missing=False)
    if gpu:
        k(*a); torch.cuda.synchronize(); launched += 1
elapsed = time.perf_counter() - t0
print(json.dumps({"seconds": elapsed, "imports": t_imports, "prepare": t_prepare, "kernels": len(pairs), "launched": launched,
                  "compiles": jit.counters()["compiles"]}))
"""


def run_child(mode: str, op: str, t: int, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, mode, op, str(t)], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{mode}/{op} child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", nargs="+", default=["mhc_pre", "mhc_post"])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default="bench_out/warm_load.json")
    args = ap.parse_args()
    env = dict(os.environ)
    env.setdefault("TILELANG_CACHE_DIR", tempfile.mkdtemp(prefix="tl-cache-"))
    env["TILELANG_DISABLE_CACHE"] = "0"
    results = {}
    for op in args.ops:
        subprocess.run([sys.executable, "-c",
                        "import sys, tilelang, dsv4_jit\nfrom dsv4_jit import jit\n"
                        "from dsv4_jit.kernels import op_variants as variants_for_op\n"
                        "for s, v in variants_for_op(sys.argv[1], int(sys.argv[2])):\n"
                        "    jit.compile_variant(s, v)\n"
                        "    p = dsv4_jit.get_profile(v.arch)\n"
                        "    tilelang.compile(s.build(v), target=p.target, execution_backend='tvm_ffi', pass_configs=s.pass_configs(v))\n",
                        op, str(args.tokens)], env=env, check=True)  # populate both caches, untimed
        row = {}
        for mode in ("tilelang", "ours"):
            runs = [run_child(mode, op, args.tokens, env) for _ in range(args.repeat)]
            row[mode] = {"median_ms": 1e3 * statistics.median(r["seconds"] for r in runs),
                         "imports_s": statistics.median(r["imports"] for r in runs),
                         "prepare_ms": 1e3 * statistics.median(r["prepare"] for r in runs),
                         "kernels": runs[0]["kernels"], "launched": runs[0]["launched"],
                         "compiles": max(r["compiles"] for r in runs)}
        row["speedup"] = row["tilelang"]["median_ms"] / row["ours"]["median_ms"]
        results[op] = row
    import torch
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU (load only, no launch)"
    print(f"\nwarm first use in a fresh process, T={args.tokens}, {dev}; median of {args.repeat}")
    print(f"{'op':10} {'kernels':>7} {'tilelang disk hit':>18} {'dsv4-jit':>10} {'speedup':>8} {'our compiles':>13}"
          f" {'once/process':>13}")
    for op, r in results.items():
        print(f"{op:10} {r['ours']['kernels']:>7} {r['tilelang']['median_ms']:>15.2f} ms {r['ours']['median_ms']:>7.2f} ms "
              f"{r['speedup']:>7.1f}x {r['ours']['compiles']:>13} {r['ours']['prepare_ms']:>10.1f} ms")
    print("once/process: jit.prepare() at engine start (store open + toolchain fingerprint), not per kernel")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": dev, "tokens": args.tokens, "results": results}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
