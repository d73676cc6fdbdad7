"""Write benchmarks/RESULTS.md from the GPU passes' output folders: where every figure came from (benchmark, GPU,
date, exact command), the status of each family and schedule (GPU cases and the scoreboard), the scoreboard's
points (goal_table.py) and the other families' latest figures.

    python benchmarks/results.py BENCH_DIR [LATER_DIR ...] [--cases CASES_DIR/gpu_cases.jsonl]
        [--other-gpu OTHER_BENCH_DIR ...] [--out benchmarks/RESULTS.md]

BENCH_DIR is what `scripts/gpu_pass.sh bench` leaves (gpu_pass_bench/ in its tarball): the benchmarks' JSON,
bench_floor.json and mma_peak.json; gpu_cases.jsonl (the GPU cases' worst per-token errors) comes from a cases pass
(`scripts/gpu_pass.sh`, gpu_pass_cases/). --other-gpu adds a whole bench pass of the same code on another GPU kind
(an H200 beside an H100) as a scoreboard of its own, judged on that call's floors. Nothing here is typed by hand:
rerun it after a pass.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks.* imports
from benchmarks.goal_table import (BLOCK, FAMILIES, family_of, load, pass_lines, read_passes, scoreboard,  # noqa: E402
                                   summary)

VERDICTS = ("met", "short", "unreachable", "no data")


def _num(v, p: int = 2) -> str:
    if isinstance(v, bool) or v is None:
        return "-" if v is None else str(v)
    if isinstance(v, (int, float)):
        return f"{v:,.{p}f}" if isinstance(v, float) else f"{v:,}"
    return str(v)


def _table(head: list[str], rows: list[list]) -> list[str]:
    return (["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            + ["| " + " | ".join(_num(c) for c in r) + " |" for r in rows])


def gpu_cases(path: Path) -> dict[tuple[str, str], dict]:
    """(family, schedule) -> {"cases": n, "worst": the largest per-token error over its outputs} from the GPU
    cases' report (one JSON line per passed case)."""
    out: dict[tuple[str, str], dict] = {}
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        sched = r["schedule"].split(" on ")
        key = (r["family"], sched[1] if sched[0] == sched[-1] else r["schedule"])
        c = out.setdefault(key, {"cases": 0, "worst": 0.0})
        c["cases"] += 1
        c["worst"] = max([c["worst"], *(e for e, _ in r["worst_per_token_rel_err"].values())])
    return out


def sources(docs: list[tuple[str, dict]]) -> list[str]:
    rows = [[f"`{name}`", doc.get("device", "?"), doc.get("date", "-"), f"`{doc['command']}`" if doc.get("command")
             else "-"] for name, doc in sorted(docs, key=lambda nd: (nd[0], nd[1].get("date") or ""))]
    return _table(["file", "GPU", "date", "command"], rows)


def cases_source(path: Path) -> list[str]:
    """Where the GPU cases' rows came from: the file, its rows, GPU(s) and dates."""
    rows = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    if not rows:
        return ["GPU cases: no `gpu_cases.jsonl` given (run `bash scripts/gpu_pass.sh`, then `--cases`)."]
    # rows name their GPU and date; a pass's env.log beside the file (GPU, driver, memory) stands in where they don't
    env = path.parent / "env.log"
    env_lines = env.read_text().splitlines() if env.is_file() else []
    env_gpu = env_lines[0].split(",")[0].strip() if env_lines else None
    devices = sorted({r.get("device") or env_gpu or "a GPU not recorded" for r in rows})
    dates = sorted(r["date"] for r in rows if r.get("date"))
    if not dates and env_gpu:
        import datetime
        dates = [datetime.datetime.fromtimestamp(env.stat().st_mtime, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")]
    when = "" if not dates else f", {dates[0]}" if dates[0] == dates[-1] else f", {dates[0]} to {dates[-1]}"
    return [f"GPU cases: {len(rows)} passed cases in `gpu_cases.jsonl` of `bash scripts/gpu_pass.sh` "
            f"(`python3 -m pytest -q -m gpu tests`), on {', '.join(devices)}{when}; a failed case writes no row."]


def status(sb: dict | None, cases: dict) -> list[str]:
    keys = sorted({(s["family"], s["schedule"]) for s in (sb or {}).get("summary", [])} | set(cases))
    rows = []
    for fam, sched in keys:
        c = cases.get((fam, sched))
        s = next((s for s in (sb or {}).get("summary", []) if (s["family"], s["schedule"]) == (fam, sched)), {})
        pts = [r for r in (sb or {}).get("rows", []) if (r["family"], r["schedule"]) == (fam, sched)
               and r["ours_over_floor"] is not None]
        ratio = (f"{min(r['ours_over_floor'] for r in pts):.2f}-{max(r['ours_over_floor'] for r in pts):.2f}x"
                 if pts else "-")
        rows.append([fam, sched, f"{c['cases']} passed, worst {c['worst']:.1e}" if c else "-", ratio,
                     ", ".join(f"{s[v]} {v}" for v in VERDICTS if s.get(v)) or "-"])
    return _table(["family", "schedule", "GPU cases (per-token error)", "ours / floor", "goals"], rows)


def scoreboard_lines(sb: dict) -> list[str]:
    lines = pass_lines(sb)
    out = [(lines[0] + ". " if len(lines) == 1 else "Each point is judged against the floors measured in the GPU call "
            "that timed it. ") + "Times are us a layer (8 layers' inputs a graph, L2 flushed).", ""]
    if len(lines) > 1:
        out[1:1] = [""] + [f"- {ln}." for ln in lines]
    out += _table(["family", "schedule", "point", "ours", "read", "math", "launch", "ours / floor", "goal", "peer",
                   "verdict"],
                  [[r["family"], r["schedule"], r["point"], r["ours_us"], r["read_floor_us"], r["math_floor_us"],
                    r["launch_floor_us"], r["ours_over_floor"], r["goal"],
                    f"{r['peer']} {r['peer_us']:.1f}" if r.get("peer_us") else "-", r["verdict"]] for r in sb["rows"]])
    if sb["large_m"]:
        out += ["", "FP8 GEMM past M = 64 against cuBLAS (us, one call a graph replay):", ""]
        out += _table(["schedule", "point", "ours", "cuBLAS", "TFLOP/s", "share of fp8 peak", "verdict"],
                      [[r["schedule"], r["point"], r["ours_us"], r["cublas_us"], r["tflops"], r["share_of_fp8_peak"],
                        r["verdict"]] for r in sb["large_m"]])
    if sb["moe_prefill"]:
        out += ["", "MXFP4 MoE at prefill token counts (us, one call a graph replay; TFLOP/s over the routed rows; "
                "reported, not judged on a floor):", ""]
        out += _table(["schedule", "point", "ours", "TFLOP/s", "share of fp8 peak", "share of mma.sync peak",
                       "torch (bf16 per expert)"],
                      [[r["schedule"], r["point"], r["ours_us"], r["tflops"], r["share_of_fp8_peak"],
                        r["share_of_mma_sync_peak"], r["torch_us"]] for r in sb["moe_prefill"]])
    return out


def other_family(doc: dict, limit: int = 40) -> list[str]:
    """A family file the scoreboard does not cover (mHC, compressor): its rows' scalar fields."""
    rows = doc.get("rows") or []
    cols = [k for k, v in (rows[0] if rows else {}).items() if isinstance(v, (int, float, str)) and k != "notes"]
    return _table(cols, [[r.get(c) for c in cols] for r in rows[:limit]])


def verdict_counts(rows: list[dict]) -> str:
    """'gemm sm_90a: 7 met, 45 short; ...' over judged points (goal_table.summary's counts), per family and schedule."""
    return "; ".join(f"{fam} {sched}: " + ", ".join(f"{c[v]} {v}" for v in VERDICTS if c.get(v))
                     for (fam, sched), c in sorted(summary(rows).items()))


def _in_families(fam: str | None, families: tuple[str, ...] | None) -> bool:
    """Whether a file's or row's family is among `families` (None: all); the attention block goes with attention."""
    return families is None or (fam == BLOCK and "attention" in families) or fam in families


def other_gpu_lines(d: Path, families: tuple[str, ...] | None = None) -> list[str]:
    """A whole bench pass on another GPU kind: its files, what its points add up to, and its scoreboard; `families`
    keeps only those (the ones whose kernels the pass ran as they are now)."""
    got = read_passes([d])
    sb = scoreboard([d], got)
    shown = "" if families is None else f" ({', '.join(families)})"
    # of those, only the families this pass benchmarked (its floors file also covers the others' points)
    ran = {f for _, doc in got["used"] if (f := family_of(doc)) is not None}
    keep = tuple(f for f in (families or FAMILIES) if f in ran or (f == "attention" and BLOCK in ran))
    if families is not None:
        shown = f" ({', '.join(keep)})"
    sb = {**sb, "rows": [r for r in sb["rows"] if _in_families(r["family"], keep)],
          "large_m": sb["large_m"] if "gemm" in keep else [],
          "moe_prefill": sb["moe_prefill"] if "moe" in keep else []}
    used = [(n, doc) for n, doc in got["used"] if family_of(doc) is None or _in_families(family_of(doc), keep)]
    out = ["", f"## Scoreboard on {sb['device'] or '?'}{shown}", "", "The same code's bench pass on this GPU, judged "
           "on the floors of its own call:", ""]
    out += sources(used)
    out += ["", f"Verdicts: {verdict_counts(sb['rows'])}.", ""]
    return out + scoreboard_lines(sb)


def render(d, cases_path: Path | None = None, other_gpus: list[Path] | None = None,
           other_families: tuple[str, ...] | None = None) -> str:
    """RESULTS.md from a bench pass's folder `d` (or a list: the pass, then partial re-runs; see read_passes), with
    other GPU kinds' whole passes as scoreboards of their own."""
    dirs = [Path(x) for x in (d if isinstance(d, (list, tuple)) else [d])]
    d = dirs[0]
    has_floors = any(d.glob("bench_floor*.json"))
    if has_floors:
        got = read_passes(dirs)
        sb, used = scoreboard(dirs, got), got["used"]
    else:
        sb, used = None, [(f.name, doc) for f in sorted(d.glob("*.json")) if f.name != "goals.json"
                          and (doc := load(f)) is not None]
    docs = dict(used)
    cases = gpu_cases(cases_path or d / "gpu_cases.jsonl")
    out = ["# Results", "",
           "Generated by `python benchmarks/results.py` from the GPU passes (`scripts/gpu_pass.sh bench` and "
           "`scripts/gpu_pass.sh`); rerun it after a pass instead of editing this file. What each benchmark "
           "measures and its floor: [README.md](README.md).", "", "## Where the figures come from", ""]
    out += sources(used)
    out += [""] + cases_source(cases_path or d / "gpu_cases.jsonl")
    out += ["", "## Status", "", "GPU cases: the family's cases on both models, outputs NaN-poisoned, worst "
            "per-token error against float64. Goals: see below.", ""]
    out += status(sb, cases)
    if sb:
        out += ["", "## Scoreboard", "", "Floor = max(read, math at the measured MMA peak (mma.sync's for the SM120 schedule), PDL launch); goals: "
                "attention batch 64 <= 1.5x floor, batch 8 <= 2x, batch 1 <= 4 us; indexer step batch 64 and 8 "
                "<= 1.5x floor, batch 1 <= 4 us; decode GEMM M <= 64 <= 1.3x floor; MoE <= 1.5x at 1 token, "
                "<= 1.25x from 8; large M as fast as cuBLAS; the attention block (indexer logits -> top-k -> sparse MLA on a "
                "ratio-4 layer, sparse MLA on a ratio-128 layer, chained in one graph) against the sum of its steps' "
                "floors, within the sum of their goal times.", ""]
        out += scoreboard_lines(sb)
    for other in other_gpus or []:
        out += other_gpu_lines(Path(other), other_families)
    for name, doc in sorted(docs.items()):
        fam = family_of(doc)
        if fam is not None and fam not in (*FAMILIES, BLOCK):
            out += ["", f"## {fam} (`{name}`)", ""] + other_family(doc)
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", nargs="+", help="a GPU pass's output folder, then any later partial passes (a family's "
                                           "floors and benchmarks re-run in one call; they replace that family)")
    ap.add_argument("--cases", default=None, help="the GPU cases' results (gpu_cases.jsonl of a cases pass; default: "
                                                  "DIR/gpu_cases.jsonl)")
    ap.add_argument("--other-gpu", nargs="+", default=[], help="whole bench passes of the same code on other GPU "
                                                               "kinds: a scoreboard of their own each")
    ap.add_argument("--other-gpu-families", nargs="+", default=None, choices=FAMILIES,
                    help="show only these families of the --other-gpu passes (those whose kernels they ran as the "
                         "code has them)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "RESULTS.md"))
    args = ap.parse_args()
    Path(args.out).write_text(render([Path(x) for x in args.dir], Path(args.cases) if args.cases else None,
                                     [Path(x) for x in args.other_gpu],
                                     tuple(args.other_gpu_families) if args.other_gpu_families else None))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
