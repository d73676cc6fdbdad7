"""Each open goal point, judged: our kernel's time from the family benchmarks next to the goal's time and the
read-only floor of the same bytes (bench_floor.py), all from one GPU pass's JSON files.

A point is
  met          ours <= the goal's time
  short        ours misses it, but some read-only kernel form reaches it: the goal is reachable there, work remains
  unreachable  even the fastest read-only form (ordinary or PDL launches) misses it: no kernel that also has to
               compute can meet the goal as written on this GPU; "(launch)" where the goal's time is under what
               one PDL-chained kernel that moves nothing costs a layer: no kernel at all, whatever it reads
  no data      the family benchmark did not measure the point

Ours is the schedule native to the GPU (the file's "schedule" equals its "arch"; bench_attention's ours_sm90), per
layer (8 layers' inputs a graph, L2 flushed), the figure each goal is stated on. The floor file's goal times use its
own copy bandwidth; the family files' times come from the same pass, so run them in one device call.
"x copy" is ours over torch's device copy of the same bytes in the same harness (copy/L): the copy bandwidth a
kernel of this size could have, where the goals' 256 MiB figure is one no kernel of this size reaches.
Large-M FP8 GEMM (#12's second goal) is judged against 70% of the fp8 peak bench_mma_peak.py measured
(torch._scaled_mm 8192^3), when that file is in the directory.

    python benchmarks/goal_table.py bench_out [--out bench_out/goals.json]      (reads bench_out/bench_floor*.json)
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

FP8_PEAK_ROW = "torch._scaled_mm fp8 8192^3 (cuBLAS)"
LARGE_M_SHARE = 0.7


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _native(doc: dict) -> bool:
    """Whether a family file ran the GPU's own schedule (not the SM120 schedule emulated on it)."""
    return doc.get("schedule", doc.get("arch")) == doc.get("arch")


def _family(doc: dict) -> str | None:
    """Which family benchmark wrote a file, from its first row's keys: "attention", "indexer", "gemm", "moe" or
    None (bench_mma_peak and anything else)."""
    first = (doc.get("rows") or [{}])[0]
    if "ours_sm90" in first:
        return "attention"
    if "ours_logits_topk_per_layer_us" in first:
        return "indexer"
    if "shape" in first and "m" in first:
        return "gemm"
    if "gemm" in first and "tokens" in first:
        return "moe"
    return None


def point_key(issue: int, key: dict) -> tuple:
    """A point's join key. A ratio-4 attention layer reads 512 + 128 candidates at every context past 2K, so its
    points are one point whatever the context (bench_attention times it at its first context only)."""
    if issue == 9 and key.get("ratio") == 4:
        key = {k: v for k, v in key.items() if k != "ctx"}
    return (issue, tuple(sorted(key.items())))


def ours_by_point(files: list[dict]) -> dict[tuple, list[tuple[str, float]]]:
    """(issue, key as a sorted tuple) -> [(what, per-layer us)] from every family file given. A GEMM point gets one
    entry per decode M the benchmark ran (the goal covers M <= 64; the floor is the weights' bytes alone)."""
    out: dict[tuple, list] = {}

    def add(issue: int, key: dict, what: str, us) -> None:
        if us is not None:
            out.setdefault(point_key(issue, key), []).append((what, float(us)))

    for doc in files:
        if not _native(doc):
            continue
        family, rows = _family(doc), doc.get("rows") or []
        if family == "attention":
            for r in rows:
                add(9, {k: r[k] for k in ("heads", "ratio", "ctx", "batch")}, "", (r.get("ours_sm90") or {}).get("us"))
        elif family == "indexer":
            for r in rows:
                add(10, {"ctx": r["ctx"], "batch": r["batch"]}, "", r.get("ours_logits_topk_per_layer_us"))
        elif family == "gemm":
            for r in rows:
                if r["m"] <= 64:
                    add(12, {"model": doc["model"], "tp": doc["tp"], "n": r["n"], "k": r["k"], "groups": r["groups"]},
                        f"M={r['m']}", r.get("ours_per_layer_us"))
        elif family == "moe":
            for r in rows:
                add(12, {"model": doc["model"], "tp": doc["tp"], "n": r["n"], "k": r["k"], "tokens": r["tokens"]},
                    "", r.get("ours_per_layer_us"))
    return out


def verdict(ours: float | None, goal: float, floor: float, launch: float | None = None) -> str:
    """launch: a PDL-chained one-CTA kernel that moves nothing, per layer (bench_floor's pdl_one_cta_kernel_us)."""
    if ours is None:
        return "no data"
    if ours <= goal:
        return "met"
    if floor <= goal:
        return "short"
    return "unreachable (launch)" if launch is not None and goal < launch else "unreachable"


def judge(floor_doc: dict, files: list[dict]) -> list[dict]:
    """One row per (goal point, measured variant of it): the floor file's goal and floor with ours joined in."""
    ours = ours_by_point(files)
    launch = floor_doc.get("pdl_one_cta_kernel_us")
    rows = []
    for p in floor_doc["rows"]:
        if "key" not in p:
            raise ValueError("goal_table: the floor file has no point keys (bench_floor.py from before 2026-11-26); "
                             "run bench_floor.py again")
        found = ours.get(point_key(p["issue"], p["key"])) or [("", None)]
        for what, us in found:
            copy = p.get("copy_us")
            rows.append({"issue": p["issue"], "point": p["point"] + (f" {what}" if what else ""), "bytes": p["bytes"],
                         "goal_us": p["goal_us"], "floor_us": p["floor_us"], "ours_us": us,
                         "ours_over_goal": None if us is None else us / p["goal_us"],
                         "ours_over_floor": None if us is None else us / p["floor_us"],
                         "ours_over_copy": None if us is None or not copy else us / copy,
                         "verdict": verdict(us, p["goal_us"], p["floor_us"], launch)})
    return rows


def large_m_rows(files: list[dict], peak_tflops: float | None) -> list[dict]:
    """#12's large-M goal: each native bench_gemm row past M = 64 against 70% of the measured fp8 peak."""
    rows = []
    for doc in files:
        if _family(doc) != "gemm" or not _native(doc):
            continue
        for r in doc["rows"]:
            if r["m"] > 64 and r.get("tflops") is not None:
                share = None if not peak_tflops else r["tflops"] / peak_tflops
                rows.append({"issue": 12, "point": f"{doc['model'][12:]} TP{doc['tp']} {r['shape'].split(' (')[0]} "
                             f"M={r['m']}", "tflops": r["tflops"], "share_of_fp8_peak": share,
                             "verdict": "no data" if share is None else ("met" if share >= LARGE_M_SHARE else "short")})
    return rows


def fp8_peak(doc: dict | None) -> float | None:
    for r in (doc or {}).get("rows", []):
        if r.get("mma") == FP8_PEAK_ROW and r.get("tflops"):
            return float(r["tflops"])
    return None


def summary(rows: list[dict]) -> dict[int, dict[str, int]]:
    out: dict[int, dict[str, int]] = {}
    for r in rows:
        c = out.setdefault(r["issue"], {})
        c[r["verdict"]] = c.get(r["verdict"], 0) + 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="a GPU pass's output folder (bench_floor.json and the family benchmarks' JSON)")
    ap.add_argument("--out", default=None, help="JSON here (default DIR/goals.json)")
    args = ap.parse_args()
    d = Path(args.dir)
    # bench_floor*.json: one file, or one a part (--issues 9 10, --issues 12) run beside that part's benchmarks
    floors = [doc for f in sorted(d.glob("bench_floor*.json")) if (doc := _load(f)) is not None]
    if not floors:
        raise SystemExit(f"goal_table: no readable {d}/bench_floor*.json (run benchmarks/bench_floor.py first)")
    floor_doc = {**floors[0], "rows": [r for doc in floors for r in doc.get("rows", [])]}
    launches = [doc["pdl_one_cta_kernel_us"] for doc in floors if doc.get("pdl_one_cta_kernel_us")]
    floor_doc["pdl_one_cta_kernel_us"] = min(launches) if launches else None
    files = [doc for f in sorted(d.glob("*.json")) if not f.name.startswith("bench_floor") and f.name != "goals.json"
             and (doc := _load(f)) is not None]
    peak = next((p for doc in files if (p := fp8_peak(doc)) is not None), None)
    rows = judge(floor_doc, files)
    big = large_m_rows(files, peak)
    f = lambda v, w=8, p=2: f"{v:>{w}.{p}f}" if isinstance(v, float) else f"{'-':>{w}}"  # noqa: E731
    launch = floor_doc["pdl_one_cta_kernel_us"]
    print(f"{floor_doc.get('device', '?')}: copy {floor_doc.get('copy_bandwidth_gbs', 0):,.0f} GB/s; a PDL-chained "
          f"1-CTA kernel {'%.2f us a layer' % launch if launch else 'not measured'}")
    print(f"{'issue':>5} {'point':<48} {'goal us':>8} {'floor us':>8} {'ours us':>8} {'/goal':>6} {'/floor':>6} "
          f"{'x copy':>6}  verdict")
    for r in rows:
        print(f"{r['issue']:>5} {r['point']:<48} {f(r['goal_us'])} {f(r['floor_us'])} {f(r['ours_us'])} "
              f"{f(r['ours_over_goal'], 6)} {f(r['ours_over_floor'], 6)} {f(r['ours_over_copy'], 6)}  {r['verdict']}")
    if big:
        print(f"\nlarge-M FP8 GEMM against {LARGE_M_SHARE:.0%} of the fp8 peak "
              f"({'%.1f TFLOP/s' % peak if peak else 'not measured: run bench_mma_peak.py'})")
        for r in big:
            print(f"{r['issue']:>5} {r['point']:<48} {f(r['tflops'], 8, 1)} TFLOP/s "
                  f"{f(r['share_of_fp8_peak'], 6)}  {r['verdict']}")
    counts = summary(rows + big)
    for issue, c in sorted(counts.items()):
        print(f"#{issue}: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
    out = Path(args.out) if args.out else d / "goals.json"
    out.write_text(json.dumps({"device": floor_doc.get("device"), "fp8_peak_tflops": peak, "rows": rows,
                               "large_m": big, "summary": {str(k): v for k, v in counts.items()}}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
