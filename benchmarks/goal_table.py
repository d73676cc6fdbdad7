"""The scoreboard: each point of the performance goals, our time next to its floor, judged met / short / unreachable,
from one GPU pass's JSON files (bench_floor.py, bench_mma_peak.py and the family benchmarks, run in one device call).

A point's floor is the largest of three lower bounds on its time, per layer (8 layers' inputs a graph, L2 flushed):
  read     the fastest read-only kernel of the point's bytes (bench_floor.py; ordinary or PDL launches)
  math     its flops at the measured MMA peak of its operand type (bench_mma_peak.py: the fastest measured rate
           for that type, mma.sync or cuBLAS; the SM120 schedule's rows at mma.sync's, the only MMA it issues)
  launch   one PDL-chained one-CTA kernel that moves nothing, per kernel the step launches
The goals (GOALS below):
  attention  sparse MLA decode: batch 64 <= 1.5x floor, batch 8 <= 2x floor, batch 1 <= 4 us
  indexer    the indexer step (logits + top-k): batch 64 and 8 <= 1.5x floor, batch 1 <= 4 us
  gemm       dense FP8 GEMM at decode, M <= 64: <= 1.3x floor
  moe        MXFP4 MoE grouped GEMM: <= 1.5x floor at 1 token, <= 1.25x from 8 tokens
  large M    FP8 GEMM past M = 64: as fast as cuBLAS (torch's blockwise _scaled_mm) on the same shape
  block      the attention block as the engine runs it (bench_attention_block.py: indexer logits -> top-k -> sparse
             MLA on a ratio-4 layer, sparse MLA alone on a ratio-128 layer, one graph): its floor is the sum of its
             steps' floors, its goal the sum of its steps' goal times (a chained block may beat its steps' sum)
A point is met (ours <= the goal's time), short (ours misses a goal at or above the floor: work remains),
unreachable (an absolute goal under the floor: no kernel meets it on this GPU) or "no data" (not measured).
Both schedules are judged: the GPU's own and the SM120 schedule compiled for it.

    python benchmarks/goal_table.py bench_out [later_pass ...] [--out bench_out/goals.json]   (bench_floor*.json)
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

FAMILIES = ("attention", "indexer", "gemm", "moe")
BLOCK = "attention block"   # not a floor family: its rows are sums of the attention and indexer points
# bench_gather_floor.py: sparse MLA's candidate rows read where they lie; a table of its own, judging nothing
GATHER_FLOOR = "attention gather floor"


@dataclass(frozen=True)
class Goal:
    factor: float | None = None     # the goal's time = factor x the floor
    absolute_us: float | None = None

    def time_us(self, floor: float) -> float:
        return self.absolute_us if self.absolute_us is not None else self.factor * floor

    def __str__(self) -> str:
        return f"<= {self.absolute_us:g} us" if self.absolute_us is not None else f"<= {self.factor:g}x floor"


def goal(family: str, key: dict) -> Goal:
    """The goal of one point (key: the point's join key from bench_floor.py)."""
    if family in ("attention", "indexer"):
        batch = key["batch"]
        if batch <= 1:
            return Goal(absolute_us=4.0)
        return Goal(factor=2.0 if family == "attention" and batch <= 8 else 1.5)
    if family == "gemm":
        return Goal(factor=1.3)
    if family == "moe":
        return Goal(factor=1.5 if key["tokens"] < 8 else 1.25)
    raise ValueError(f"goal: unknown family {family!r} (one of {', '.join(FAMILIES)})")


def load(path: Path) -> dict | None:
    """A benchmark's JSON document, or None (unreadable, or not an object: e.g. the pass's variant list). A run cut
    short ("complete": false, harness.write_rows) keeps its measured rows, and stderr names it: its missing points
    are absent from the scoreboard, not judged."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    if doc.get("complete") is False:
        print(f"goal_table: {path} is a run cut short ({len(doc.get('rows', []))} rows); its missing points are "
              f"not on the scoreboard", file=sys.stderr)
    return doc


def family_of(doc: dict) -> str | None:
    """Which family benchmark wrote a file ("attention", "indexer", "gemm", "moe", "mhc", "compressor"), from its
    `benchmark` path, else from its first row's keys ("attention block" for bench_attention_block.py, "attention
    gather floor" for bench_gather_floor.py); None for anything else (bench_mma_peak, bench_floor)."""
    bench = doc.get("benchmark") or ""
    if bench == "benchmarks/attention/bench_attention_block.py":
        return BLOCK
    if bench == "benchmarks/attention/bench_gather_floor.py":
        return GATHER_FLOOR
    for fam in (*FAMILIES, "mhc", "compressor"):
        if bench == f"benchmarks/{fam}/bench_{fam}.py":
            return fam
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


def schedule_of(doc: dict) -> str:
    """"sm_90a" for the GPU's own schedule, "sm_120a on sm_90a" for the SM120 schedule compiled for the GPU."""
    arch, sched = doc.get("arch", "?"), doc.get("schedule", doc.get("arch", "?"))
    return arch if sched == arch else f"{sched} on {arch}"


def point_key(family: str, key: dict) -> tuple:
    """A point's join key. A ratio-4 attention layer reads 512 + 128 candidates at every context past 2K, so its
    points are one point whatever the context (bench_attention times it at its first context only)."""
    if family == "attention" and key.get("ratio") == 4:
        key = {k: v for k, v in key.items() if k != "ctx"}
    return (family, tuple(sorted(key.items())))


@dataclass(frozen=True)
class Measured:
    schedule: str
    what: str             # "M=8" for a decode GEMM row, else ""
    m: int | None
    ours_us: float | None
    peer: str | None      # the peer timed in the same harness, and its time
    peer_us: float | None


def measured_by_point(files: list[dict]) -> dict[tuple, list[Measured]]:
    """point key -> what the family files measured there, per schedule (and per decode M for the GEMMs)."""
    out: dict[tuple, list[Measured]] = {}

    def add(family: str, key: dict, m: Measured) -> None:
        out.setdefault(point_key(family, key), []).append(m)

    for doc in files:
        family, rows = family_of(doc), doc.get("rows") or []
        if family == "attention":
            arch = doc.get("arch", "sm_90a")
            for r in rows:
                key = {k: r[k] for k in ("heads", "ratio", "ctx", "batch")}
                peer = (r.get("vllm_triton") or {}).get("us")
                for col, sched in (("ours_sm90", arch), ("ours_sm120", f"sm_120a on {arch}")):
                    if col in r:
                        add(family, key, Measured(sched, "", None, (r[col] or {}).get("us"), "vLLM Triton", peer))
        elif family == "indexer":
            for r in rows:
                add(family, {"ctx": r["ctx"], "batch": r["batch"]},
                    Measured(schedule_of(doc), "", None, r.get("ours_logits_topk_per_layer_us"),
                             "vLLM logits + top-k (one call)", r.get("vllm_logits_topk_us")))
        elif family == "gemm":
            for r in rows:
                if r["m"] <= 64:
                    add(family, {"model": doc["model"], "tp": doc["tp"], "n": r["n"], "k": r["k"], "groups": r["groups"]},
                        Measured(schedule_of(doc), f"M={r['m']}", r["m"], r.get("ours_per_layer_us"),
                                 "torch blockwise", r.get("torch_per_layer_us")))
        elif family == "moe":
            for r in rows:
                add(family, {"model": doc["model"], "tp": doc["tp"], "n": r["n"], "k": r["k"], "tokens": r["tokens"]},
                    Measured(schedule_of(doc), "", None, r.get("ours_per_layer_us"), None, None))
    return out


def mma_peaks(doc: dict | None, mma_sync: bool = False) -> dict[str, float]:
    """Operand type ("fp8", "bf16", "fp16") -> the fastest TFLOP/s bench_mma_peak.py measured for it (mma_sync: of
    its mma.sync rows only, not the cuBLAS ones)."""
    peaks: dict[str, float] = {}
    for r in (doc or {}).get("rows", []):
        if mma_sync and "cuBLAS" in r.get("mma", ""):
            continue
        for kind in ("fp8", "bf16", "fp16"):
            if kind in r.get("mma", "").split() and r.get("tflops"):
                peaks[kind] = max(peaks.get(kind, 0.0), float(r["tflops"]))
    return peaks


def verdict(ours: float | None, goal_us: float, floor: float) -> str:
    if ours is None:
        return "no data"
    if ours <= goal_us:
        return "met"
    return "unreachable" if floor > goal_us else "short"


def peaks_for(schedule: str, peaks: dict[str, float], sync_peaks: dict[str, float] | None) -> dict[str, float]:
    """The MMA peaks a schedule's math floor is taken at: the SM120 schedule ("sm_120a", or "sm_120a on sm_90a"
    compiled for this GPU) issues mma.sync only, so mma.sync's measured rates (where the pass has them); any other
    schedule the fastest measured rate of each type."""
    return {**peaks, **(sync_peaks or {})} if schedule.startswith("sm_12") else peaks


def point_floors(p: dict, launch: float | None, peaks: dict[str, float], m: int | None = None) -> dict:
    """One floor point's read, math (at M rows for a decode GEMM) and launch floors, and the largest of them."""
    flops = p.get("flops") if m is None else p.get("flops_per_row", 0) * m
    peak = peaks.get(p.get("mma", ""))
    floors = {"read": p["floor_us"],
              "math": flops / (peak * 1e6) if flops and peak else None,
              "launch": p.get("kernels", 1) * launch if launch else None}
    bound, floor = max(((k, v) for k, v in floors.items() if v is not None), key=lambda kv: kv[1])
    return {**floors, "bound": bound, "floor": floor}


def judge(floor_doc: dict, files: list[dict], peaks: dict[str, float] | None = None,
          sync_peaks: dict[str, float] | None = None) -> list[dict]:
    """One row per (point, schedule, decode M): our time, the three floors and the largest, the goal, the verdict."""
    measured = measured_by_point(files)
    launch = floor_doc.get("pdl_one_cta_kernel_us")
    peaks = peaks or {}
    rows = []
    for p in floor_doc["rows"]:
        if "key" not in p or "family" not in p:
            raise ValueError("goal_table: the floor file's points have no family and key: run bench_floor.py again")
        found = measured.get(point_key(p["family"], p["key"])) or [Measured("-", "", None, None, None, None)]
        for ms in found:
            f = point_floors(p, p.get("_launch", launch), peaks_for(ms.schedule, p.get("_peaks", peaks),
                                                                   p.get("_sync_peaks", sync_peaks)), ms.m)
            g = goal(p["family"], p["key"])
            goal_us = g.time_us(f["floor"])
            us = ms.ours_us
            rows.append({"family": p["family"], "schedule": ms.schedule,
                         "point": p["point"] + (f" {ms.what}" if ms.what else ""), "bytes": p["bytes"],
                         "ours_us": us, "read_floor_us": f["read"], "math_floor_us": f["math"],
                         "launch_floor_us": f["launch"], "floor_us": f["floor"], "bound": f["bound"],
                         "ours_over_floor": None if us is None else us / f["floor"], "goal": str(g), "goal_us": goal_us,
                         "peer": ms.peer, "peer_us": ms.peer_us, "verdict": verdict(us, goal_us, f["floor"])})
    return rows


def block_rows(floor_doc: dict, files: list[dict], peaks: dict[str, float] | None = None,
               sync_peaks: dict[str, float] | None = None) -> list[dict]:
    """The attention block (bench_attention_block.py), per layer and schedule, against the sum of its steps' floors:
    the sparse MLA point and, on a ratio-4 layer, the indexer step at the same context and batch. Each floor column
    is the sum of the steps' own; the goal is the sum of the steps' goal times. A block whose step has no floor
    point is left out (no data to judge it by)."""
    launch = floor_doc.get("pdl_one_cta_kernel_us")
    by_key = {point_key(p["family"], p["key"]): p for p in floor_doc["rows"] if "key" in p and "family" in p}
    rows = []
    for doc in (d for d in files if family_of(d) == BLOCK):
        arch = doc.get("arch", "sm_90a")
        for r in doc.get("rows") or []:
            steps = [("attention", {k: r[k] for k in ("heads", "ratio", "ctx", "batch")})]
            if r["ratio"] == 4:
                steps.append(("indexer", {"ctx": r["ctx"], "batch": r["batch"]}))
            pts = [by_key.get(point_key(fam, key)) for fam, key in steps]
            if None in pts:
                continue
            for col in ("ours_sm90", "ours_sm120"):
                if col not in r:
                    continue
                sched = (r[col] or {}).get("schedule") or ("sm_120a" if col == "ours_sm120" else arch)
                us = (r[col] or {}).get("us")
                fl = [point_floors(p, p.get("_launch", launch),
                                   peaks_for(sched, p.get("_peaks", peaks or {}), p.get("_sync_peaks", sync_peaks)))
                      for p in pts]
                total = {k: None if any(f[k] is None for f in fl) else sum(f[k] for f in fl)
                         for k in ("read", "math", "launch", "floor")}
                goal_us = sum(goal(p["family"], p["key"]).time_us(f["floor"]) for p, f in zip(pts, fl))
                rows.append({"family": BLOCK, "schedule": arch if sched == arch else f"{sched} on {arch}",
                             "point": f"H{r['heads']} ratio {r['ratio']} {r['ctx'] // 1024}K x {r['batch']}",
                             "bytes": sum(p["bytes"] for p in pts), "ours_us": us, "read_floor_us": total["read"],
                             "math_floor_us": total["math"], "launch_floor_us": total["launch"],
                             "floor_us": total["floor"], "bound": "sum",
                             "ours_over_floor": None if us is None else us / total["floor"],
                             "goal": f"<= steps' goals ({goal_us:.1f} us)", "goal_us": goal_us, "peer": None,
                             "peer_us": None, "verdict": verdict(us, goal_us, total["floor"])})
    return rows


def large_m_rows(files: list[dict], fp8_peak: float | None) -> list[dict]:
    """FP8 GEMM past M = 64 (both schedules): ours against cuBLAS (torch's blockwise _scaled_mm) on the same shape."""
    rows = []
    for doc in files:
        if family_of(doc) != "gemm":
            continue
        for r in doc["rows"]:
            if r["m"] <= 64:
                continue
            ours, cublas = r.get("ours_us"), r.get("torch_us")
            rows.append({"family": "gemm large M", "schedule": schedule_of(doc),
                         "point": f"{doc['model'][12:]} TP{doc['tp']} {r['shape'].split(' (')[0]} M={r['m']}",
                         "ours_us": ours, "cublas_us": cublas, "tflops": r.get("tflops"),
                         "share_of_fp8_peak": r["tflops"] / fp8_peak if fp8_peak and r.get("tflops") else None,
                         "goal": "<= cuBLAS",
                         "verdict": "no data" if ours is None or cublas is None else
                         ("met" if ours <= cublas else "short")})
    return rows


MOE_PREFILL_FROM = 2048   # MoE rows from this many tokens are prefill: reported in TFLOP/s, not judged on a floor


def moe_prefill_rows(files: list[dict], fp8_peak: float | None, sync_peaks: dict[str, float]) -> list[dict]:
    """MXFP4 MoE at prefill token counts (both schedules): TFLOP/s over the routed rows, against the fastest measured
    fp8 rate (cuBLAS) and against mma.sync's rate for the operand the variant multiplies (Hopper's 16+ row blocks:
    f16; the SM120 schedule: e4m3)."""
    rows = []
    for doc in files:
        if family_of(doc) != "moe":
            continue
        for r in doc["rows"]:
            if r["tokens"] < MOE_PREFILL_FROM:
                continue
            tf = r.get("ours_tflops")
            sync = sync_peaks.get("fp16" if r.get("operand") == "float16" else "fp8")
            point = f"{doc['model'][12:]} TP{doc['tp']} MoE {r['gemm']} {r['k']}->{r['n']} T{r['tokens']}"
            rows.append({"family": "moe prefill", "schedule": schedule_of(doc), "point": point,
                         "ours_us": r.get("ours_us"), "tflops": tf, "operand": r.get("operand"),
                         "share_of_fp8_peak": tf / fp8_peak if fp8_peak and tf else None,
                         "share_of_mma_sync_peak": tf / sync if sync and tf else None, "torch_us": r.get("torch_us")})
    return rows


def summary(rows: list[dict]) -> dict[tuple[str, str], dict[str, int]]:
    """(family, schedule) -> verdict -> count."""
    out: dict[tuple[str, str], dict[str, int]] = {}
    for r in rows:
        c = out.setdefault((r["family"], r["schedule"]), {})
        c[r["verdict"]] = c.get(r["verdict"], 0) + 1
    return out


def _pass_docs(d: Path) -> tuple[list[tuple[str, dict]], list[tuple[str, dict]]]:
    """(floor files, other files) of one pass's folder, as (name, document); goals.json is its own output."""
    floors = [(f.name, doc) for f in sorted(d.glob("bench_floor*.json")) if (doc := load(f)) is not None]
    others = [(f.name, doc) for f in sorted(d.glob("*.json")) if not f.name.startswith(("bench_floor", "goals"))
              and (doc := load(f)) is not None]
    return floors, others


def read_passes(dirs: list[Path]) -> dict:
    """One bench pass's folder, optionally followed by later passes that re-ran some families (their floors with
    `bench_floor.py --families ...` and those families' benchmarks, in one GPU call). A later pass's floor families
    replace the earlier floors and benchmark files of those families; each point keeps the launch floor and MMA
    peaks of the pass that timed it, so every verdict compares figures from one GPU call. Returns the floor rows
    (each with its pass's "_launch" and "_peaks"), the family files judged against them, one summary a pass, and
    (name, document) of every file used (of mhc and compressor files, the latest of each name)."""
    floor_pass: dict[str, int] = {}
    passes, per_pass = [], []
    for i, d in enumerate(dirs):
        floors, others = _pass_docs(d)
        if not floors and i == 0:
            raise SystemExit(f"goal_table: no readable {d}/bench_floor*.json (run benchmarks/bench_floor.py first)")
        peaks: dict[str, float] = {}
        sync_peaks: dict[str, float] = {}
        for _, doc in others:
            for kind, v in mma_peaks(doc).items():
                peaks[kind] = max(peaks.get(kind, 0.0), v)
            for kind, v in mma_peaks(doc, mma_sync=True).items():
                sync_peaks[kind] = max(sync_peaks.get(kind, 0.0), v)
        # bench_floor*.json: one file, or one a part (--families attention indexer, --families gemm moe)
        launches = [doc["pdl_one_cta_kernel_us"] for _, doc in floors if doc.get("pdl_one_cta_kernel_us")]
        fams = sorted({r["family"] for _, doc in floors for r in doc.get("rows", []) if "family" in r})
        for fam in fams:
            floor_pass[fam] = i
        first = floors[0][1] if floors else {}
        passes.append({"dir": str(d), "device": first.get("device"), "date": first.get("date"),
                       "copy_bandwidth_gbs": first.get("copy_bandwidth_gbs"),
                       "pdl_one_cta_kernel_us": min(launches) if launches else None, "mma_peak_tflops": peaks,
                       "mma_sync_peak_tflops": sync_peaks, "families": fams})
        per_pass.append((floors, others))
    rows, files, extra, used = [], [], {}, []
    for i, (floors, others) in enumerate(per_pass):
        info = passes[i]
        for name, doc in floors:
            mine = [r for r in doc.get("rows", []) if floor_pass.get(r.get("family")) == i]
            rows += [{**r, "_launch": info["pdl_one_cta_kernel_us"], "_peaks": info["mma_peak_tflops"],
                      "_sync_peaks": info["mma_sync_peak_tflops"]} for r in mine]
            if mine:
                used.append((name, doc))
        for name, doc in others:
            fam = family_of(doc)
            judged_by = "attention" if fam == BLOCK else fam
            if fam in (*FAMILIES, BLOCK):
                if floor_pass.get(judged_by) == i:
                    files.append(doc)
                    used.append((name, doc))
            elif fam is not None:
                extra[name] = doc
            elif mma_peaks(doc) and any(floor_pass.get(f) == i for f in FAMILIES):
                used.append((name, doc))
    used += sorted(extra.items())
    for i, info in enumerate(passes):
        info["families"] = [f for f in info["families"] if floor_pass[f] == i]   # what it still provides
    rows.sort(key=lambda r: FAMILIES.index(r["family"]) if r.get("family") in FAMILIES else len(FAMILIES))
    return {"floor_rows": rows, "files": files, "passes": passes, "used": used}


def scoreboard(dirs, got: dict | None = None) -> dict:
    """Everything the scoreboard says about one pass's folder (or a pass followed by partial re-runs, see
    read_passes; `got`: their read_passes, where the caller has it), as one JSON-able dict."""
    if got is None:
        got = read_passes([Path(d) for d in (dirs if isinstance(dirs, (list, tuple)) else [dirs])])
    base = got["passes"][0]
    floor_doc = {"rows": got["floor_rows"], "pdl_one_cta_kernel_us": base["pdl_one_cta_kernel_us"]}
    files = got["files"]   # judge, block_rows and large_m_rows each take their own families' files
    both = (base["mma_peak_tflops"], base.get("mma_sync_peak_tflops"))
    rows = judge(floor_doc, files, *both) + block_rows(floor_doc, files, *both)
    def last_pass_of(family: str) -> dict:   # the latest pass that benchmarked the family: its peaks go with it
        return next((p for p in reversed(got["passes"]) if family in p["families"]), base)
    big = large_m_rows(files, last_pass_of("gemm")["mma_peak_tflops"].get("fp8"))
    moe_pass = last_pass_of("moe")
    prefill = moe_prefill_rows(files, moe_pass["mma_peak_tflops"].get("fp8"),
                               moe_pass.get("mma_sync_peak_tflops") or {})
    return {"device": base["device"], "date": base["date"], "copy_bandwidth_gbs": base["copy_bandwidth_gbs"],
            "pdl_one_cta_kernel_us": base["pdl_one_cta_kernel_us"], "mma_peak_tflops": base["mma_peak_tflops"],
            "mma_sync_peak_tflops": base.get("mma_sync_peak_tflops", {}),
            "passes": got["passes"], "rows": rows, "large_m": big, "moe_prefill": prefill,
            "summary": [{"family": f, "schedule": s, **c} for (f, s), c in summary(rows + big).items()]}


def pass_lines(sb: dict) -> list[str]:
    """One line a pass: its GPU, copy bandwidth, launch floor and MMA peaks (and, with several, its families)."""
    out = []
    for p in sb.get("passes") or [sb]:
        launch = p["pdl_one_cta_kernel_us"]
        if not (p["device"] or p["copy_bandwidth_gbs"] or launch or p["mma_peak_tflops"]):
            continue   # a folder with no floors of its own (the gather floor's run): nothing to say of its GPU
        several = len(sb.get("passes") or []) > 1 and p.get("families")
        fams = f" ({', '.join(p['families'])})" if several else ""
        out.append(f"{p['device'] or '?'}{fams}: copy {p['copy_bandwidth_gbs'] or 0:,.0f} GB/s; a PDL-chained one-CTA "
                   f"kernel {'%.2f us a layer' % launch if launch else 'not measured'}; MMA peaks "
                   + (", ".join(f"{k} {v:,.0f}" + _sync_note(p, k, v) for k, v in p["mma_peak_tflops"].items())
                      or "not measured")
                   + " TFLOP/s")
    return out


def _sync_note(p: dict, kind: str, peak: float) -> str:
    """ " (mma.sync 443)" where mma.sync's rate of a type (the SM120 schedule's math floor) is not the fastest one."""
    sync = (p.get("mma_sync_peak_tflops") or {}).get(kind)
    return f" (mma.sync {sync:,.0f})" if sync and sync != peak else ""


def _f(v, w: int = 8, p: int = 2) -> str:
    return f"{v:>{w}.{p}f}" if isinstance(v, (int, float)) else f"{'-':>{w}}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", nargs="+", help="a GPU pass's output folder (bench_floor.json and the family benchmarks' "
                                           "JSON), then any later partial passes (see read_passes)")
    ap.add_argument("--out", default=None, help="JSON here (default DIR/goals.json, the first DIR)")
    args = ap.parse_args()
    d = Path(args.dir[0])
    sb = scoreboard([Path(x) for x in args.dir])
    for line in pass_lines(sb):
        print(line)
    print(f"{'family':<9} {'schedule':<17} {'point':<44} {'ours us':>8} {'floor':>8} {'bound':>6} {'/floor':>6} "
          f"{'goal':>16}  verdict")
    for r in sb["rows"]:
        print(f"{r['family']:<9} {r['schedule']:<17} {r['point']:<44} {_f(r['ours_us'])} {_f(r['floor_us'])} "
              f"{r['bound']:>6} {_f(r['ours_over_floor'], 6)} {r['goal']:>16}  {r['verdict']}")
    for r in sb["large_m"]:
        print(f"{'gemm':<9} {r['schedule']:<17} {r['point']:<44} {_f(r['ours_us'], 8, 1)} cuBLAS "
              f"{_f(r['cublas_us'], 8, 1)}  {r['verdict']}")
    for r in sb["moe_prefill"]:
        print(f"{'moe':<9} {r['schedule']:<17} {r['point']:<44} {_f(r['ours_us'], 8, 1)} {_f(r['tflops'], 6, 0)} "
              f"TFLOP/s")
    for s in sb["summary"]:
        print(f"{s['family']} ({s['schedule']}): " + ", ".join(f"{k} {v}" for k, v in sorted(s.items())
                                                              if k not in ("family", "schedule")))
    out = Path(args.out) if args.out else d / "goals.json"
    out.write_text(json.dumps(sb, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
