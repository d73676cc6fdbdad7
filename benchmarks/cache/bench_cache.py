"""Cache benchmark: bundle import throughput and warm lookup latency.

    python benchmarks/cache/bench_cache.py [--entries 200] [--file-kb 300] [--lookups 1000] [--out bench_out/cache.json]

Import: a bundle of N entries, each one ~file-kb .so-like file (half random bytes, half a
repetitive table, so it compresses about as much as a real kernel library) plus a small source
file, exported with export_bundle and imported into an empty store. Throughput counts the
uncompressed artifact bytes installed per second (the whole import: stream, hash, spool, fsync,
publish).

Warm lookup: `lookups` imported entries, verified once (the first read hashes imported entries),
then looked up in a fresh process with a fresh Store (so no in-process memo helps): the median
over rounds of µs per `store.lookup` that returns an Entry.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dsv4_jit.cache_tools import Store, compute_key, export_bundle, import_bundle

FP = {"tilelang": "bench", "tilelang_libs": "0" * 64, "nvcc": "bench", "host_abi": "bench"}


def so_like(size: int, rng_seed: int) -> bytes:
    half = size // 2
    table = (rng_seed.to_bytes(4, "little") + bytes(range(60))) * (half // 64 + 1)
    return b"\x7fELF" + os.urandom(half - 4) + table[: size - half]


def fill(root: Path, n: int, file_bytes: int, tag: str) -> list[str]:
    s = Store(root, layers=[])
    keys = []
    for i in range(n):
        f = {"kernel": f"bench_{tag}", "arch": "sm_90a", "variant": i}
        key = compute_key(f)
        keys.append(key)

        def build(st: Path, i=i) -> dict:
            (st / "kernel.so").write_bytes(so_like(file_bytes, i))
            (st / "kernel.cu").write_text(f"// variant {i}\n" * 20)
            return {"smem_bytes": 1024 * (i % 200)}
        s.get_or_build(key, f, build)
    return keys


LOOKUP_CHILD = r"""
import json, sys, time
from dsv4_jit.cache_tools import Store
root, keys_file, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
keys = json.load(open(keys_file))
per = []
for r in range(rounds):
    s = Store(root, layers=[])            # fresh Store object each round
    t = time.perf_counter()
    hits = sum(1 for k in keys if s.lookup(k) is not None)
    per.append((time.perf_counter() - t) / len(keys) * 1e6)
    assert hits == len(keys), hits
t = time.perf_counter()
for _ in range(200000):
    pass
loop_ns = (time.perf_counter() - t) / 200000 * 1e9
print(json.dumps({"us_per_lookup": per, "empty_loop_ns": loop_ns}))
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=200)
    ap.add_argument("--file-kb", type=int, default=300)
    ap.add_argument("--lookups", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="bench_out/cache.json")
    ap.add_argument("--workdir", default=None, help="scratch dir (default: a new temp dir)")
    a = ap.parse_args(argv)
    work = Path(a.workdir or tempfile.mkdtemp(prefix="dsv4-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ.pop("DSV4_JIT_CACHE_LAYERS", None)

    # ---- import throughput
    fill(work / "src", a.entries, a.file_kb * 1024, "imp")
    bundle = work / "bundle.tar.gz"
    ex = export_bundle(Store(work / "src", layers=[]), bundle, FP)
    im = import_bundle(Store(work / "dst", layers=[]), bundle, FP)
    assert im["installed"] == a.entries

    # ---- warm lookup of imported entries, after their first verification
    keys = fill(work / "lsrc", a.lookups, 8 * 1024, "lookup")
    lb = work / "lookup.tar.gz"
    export_bundle(Store(work / "lsrc", layers=[]), lb, FP)
    ldst = work / "ldst"
    import_bundle(Store(ldst, layers=[]), lb, FP)
    s = Store(ldst, layers=[])
    t = time.perf_counter()
    assert all(s.lookup(k) is not None for k in keys)
    first_us = (time.perf_counter() - t) / len(keys) * 1e6
    keys_file = work / "keys.json"
    keys_file.write_text(json.dumps(keys))
    child = subprocess.run([sys.executable, "-c", LOOKUP_CHILD, str(ldst), str(keys_file), str(a.rounds)],
                           capture_output=True, text=True, check=True)
    lk = json.loads(child.stdout)
    warm = statistics.median(lk["us_per_lookup"])

    result = {
        "machine": {"python": platform.python_version(), "cpu_count": os.cpu_count(),
                    "platform": platform.platform(), "empty_loop_ns": round(lk["empty_loop_ns"], 1)},
        "import": {"entries": a.entries, "file_kb": a.file_kb, "bytes": im["bytes"],
                   "compressed_bytes": im["compressed_bytes"], "seconds": im["seconds"],
                   "check_seconds": im["check_seconds"], "mb_per_s": im["mb_per_s"],
                   "compressed_mb_per_s": round(im["compressed_bytes"] / 1e6 / im["seconds"], 2),
                   "export_seconds": ex["seconds"]},
        "lookup": {"entries": a.lookups, "rounds": a.rounds, "first_read_verify_us": round(first_us, 1),
                   "warm_us_per_lookup_median": round(warm, 2),
                   "warm_us_per_lookup_rounds": [round(x, 2) for x in lk["us_per_lookup"]]},
    }
    rows = [("import", f"{a.entries} entries x {a.file_kb} KB", f"{im['bytes'] / 1e6:.1f} MB in {im['seconds']:.2f} s",
             f"{im['mb_per_s']:.1f} MB/s"),
            ("export", "same bundle", f"{ex['compressed_bytes'] / 1e6:.1f} MB gz in {ex['seconds']:.2f} s",
             f"{im['bytes'] / 1e6 / ex['seconds']:.1f} MB/s"),
            ("first lookup", f"{a.lookups} imported entries", "sha256 verify", f"{first_us:.1f} us/lookup"),
            ("warm lookup", f"{a.lookups} entries, fresh process", f"median of {a.rounds} rounds",
             f"{warm:.1f} us/lookup")]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    print(f"(CPython empty-loop iteration here: {lk['empty_loop_ns']:.0f} ns; ~15-25 ns on a typical desktop)")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
