#!/usr/bin/env python3
"""GPU evidence that dsv4-jit serves from its cache in vLLM 0.33's environment (TileLang 0.1.12,
apache-tvm-ffi 0.1.11, the versions vLLM 0.33.0 pins), with no vLLM needed.

    python3 scripts/gpu_coinstall_check.py [--tilelang 0.1.12] [--tokens 1,7,32,33,256] [--work DIR]

1. the environment: TileLang and apache-tvm-ffi are the versions asked for, dsv4-jit's own requirements are
   met by what is installed (`pip check`'s lines about dsv4-jit), and the vLLM plugin entry point
   (`vllm.general_plugins` -> dsv4_jit) is registered and loads;
2. build: scripts/gpu_engine_plugin_check.py in a fresh process with an empty cache: it plans what the vLLM
   plugin plans, compiles it with this TileLang, seals and checks every mHC route against the float64
   reference; then `dsv4-jit cache export` writes the bundle;
3. serve: `dsv4-jit cache import` of that bundle into another empty cache, and the same check in another
   fresh process: it must report 0 compiled variants, 0 compiles after the seal, and pass again.
Exit 0 when everything holds.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def environment_problems(tilelang: str, tvm_ffi: str | None) -> list[str]:
    bad = []
    got = {"tilelang": metadata.version("tilelang"), "apache-tvm-ffi": metadata.version("apache-tvm-ffi")}
    print(f"installed: tilelang {got['tilelang']}, apache-tvm-ffi {got['apache-tvm-ffi']}, "
          f"torch {metadata.version('torch')}, dsv4-jit {metadata.version('dsv4-jit')}")
    if got["tilelang"] != tilelang:
        bad.append(f"tilelang {got['tilelang']} installed, {tilelang} asked for")
    if tvm_ffi and got["apache-tvm-ffi"] != tvm_ffi:
        bad.append(f"apache-tvm-ffi {got['apache-tvm-ffi']} installed, {tvm_ffi} asked for")
    # pip check over everything pip sees here; only dsv4-jit's own lines concern this check
    r = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=300)
    print(f"pip check: {(r.stdout + r.stderr).strip() or 'exit ' + str(r.returncode)}")
    bad += [f"pip check: {ln}" for ln in r.stdout.splitlines() if ln.lower().startswith(("dsv4-jit ", "dsv4_jit "))]
    eps = [e for e in metadata.entry_points(group="vllm.general_plugins") if e.name == "dsv4_jit"]
    if not eps:
        bad.append("vllm.general_plugins entry point dsv4_jit is not registered")
    else:
        print(f"vLLM plugin entry point: {eps[0].value} -> {eps[0].load()!r}")
    return bad


def run(cmd: list[str], cache: Path) -> str:
    env = {**os.environ, "DSV4_JIT_CACHE_DIR": str(cache), "DSV4_JIT_CACHE_LAYERS": ""}
    print("+", " ".join(cmd), f"(DSV4_JIT_CACHE_DIR={cache})", flush=True)
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    out = r.stdout + r.stderr
    print(out.rstrip())
    if r.returncode != 0:
        raise SystemExit(f"FAIL: exit {r.returncode}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tilelang", default="0.1.12", help="the TileLang version this environment must hold")
    ap.add_argument("--tvm-ffi", default="0.1.11", help="the apache-tvm-ffi version ('' for any)")
    ap.add_argument("--tokens", default="1,7,32,33,256")
    ap.add_argument("--work", default=None, help="dir for the two caches and the bundle (default: a temp dir)")
    a = ap.parse_args()

    bad = environment_problems(a.tilelang, a.tvm_ffi or None)
    work = Path(a.work or tempfile.mkdtemp(prefix="dsv4-coinstall-"))
    build, serve, bundle = work / "build-cache", work / "serve-cache", work / "bundle.tar.gz"
    check = [sys.executable, str(ROOT / "scripts" / "gpu_engine_plugin_check.py"), "--tokens", a.tokens]
    cli = [sys.executable, "-m", "dsv4_jit"]

    out = run(check, build)
    m = re.search(r"warmup: (\d+) variants, (\d+) compiled", out)
    print(f"build: {m.group(1)} variants, {m.group(2)} compiled with TileLang {a.tilelang}" if m else "build: ?")
    run(cli + ["cache", "export", str(bundle), "--cache-dir", str(build)], build)
    run(cli + ["cache", "import", str(bundle), "--cache-dir", str(serve)], serve)
    out = run(check, serve)
    m = re.search(r"warmup: (\d+) variants, (\d+) compiled", out)
    if not m or m.group(2) != "0":
        bad.append(f"serving from the imported bundle compiled: {m.group(0) if m else 'no warmup line'}")
    if "compiles after warmup: 0" not in out or not out.rstrip().endswith("OK"):
        bad.append("the serve-side check did not end OK with 0 compiles after warmup")
    for b in bad:
        print("FAIL", b)
    print("OK" if not bad else f"{len(bad)} failure(s)")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
