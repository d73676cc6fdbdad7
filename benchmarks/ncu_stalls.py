"""Where a kernel's warps wait, from Nsight Compute's per-instruction stall samples: the share of each stall reason,
the SASS regions (runs of consecutive instructions) that hold the most samples with their reasons and opcodes, and
the top instructions. Input: the source page of a report as CSV, e.g.

  ncu --clock-control none -k regex:sparse_mla_fwd --launch-skip 1 --launch-count 1 --set full -o att \\
      python benchmarks/attention/profile_attention.py --batch 64
  ncu --import att.ncu-rep --page source --csv --print-source sass > att.csv
  python benchmarks/ncu_stalls.py att.csv [--region 250] [--top 20] [--json out.json]

A sample names the instruction a warp was stuck at, not what it waited for: a barrier wait or a dependent load often
shows up on the first instruction after it (docs/adding_a_kernel.md). Time a variant without the suspect work before
building on a profile.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"
STALL_PREFIX = "stall_"
NOT_ISSUED = "(Not Issued)"


def _num(x: str) -> float:
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def read_source_csv(path: str | Path) -> tuple[str, list[dict]]:
    """(kernel name, one dict per SASS instruction: source text, samples, and each stall reason's samples)."""
    rows = list(csv.reader(Path(path).open(errors="replace")))
    kernel = next((r[1] for r in rows if len(r) > 1 and r[0] == "Kernel Name"), "")
    try:
        hi = next(i for i, r in enumerate(rows) if "Source" in (c.strip() for c in r) and SAMPLES in r)
    except StopIteration:
        raise ValueError(f"{path}: no header with 'Source' and '{SAMPLES}' (want `ncu --page source --csv "
                         f"--print-source sass` output)") from None
    hdr = rows[hi]
    src, smp = hdr.index("Source"), hdr.index(SAMPLES)
    reasons = [(i, c[len(STALL_PREFIX):]) for i, c in enumerate(hdr) if c.startswith(STALL_PREFIX) and NOT_ISSUED not in c]
    out = []
    for r in rows[hi + 1:]:
        if len(r) != len(hdr):
            continue
        stalls = {name: _num(r[i]) for i, name in reasons}
        out.append({"source": r[src].strip(), "samples": _num(r[smp]),
                    "stalls": {k: v for k, v in stalls.items() if v}})
    return kernel, out


def opcode(source: str) -> str:
    """The instruction's opcode without its modifiers or predicate: '@!P1 LDS.128 R8, [R13]' -> 'LDS'."""
    words = [w for w in source.split() if not w.startswith("@")]
    return words[0].split(".")[0] if words else ""


def _stall_sums(insts: list[dict]) -> dict[str, float]:
    sums: dict[str, float] = {}
    for i in insts:
        for k, v in i["stalls"].items():
            sums[k] = sums.get(k, 0.0) + v
    return sums


def summarize(insts: list[dict], region: int = 250, top: int = 20, min_share: float = 0.02) -> dict:
    """Stall reasons' shares, the regions of `region` instructions holding at least `min_share` of the samples, and
    the `top` instructions by samples."""
    if region < 1 or top < 0:
        raise ValueError(f"region must be >= 1 and top >= 0, got {region} / {top}")
    total = sum(i["samples"] for i in insts)
    if not total:
        raise ValueError("no stall samples in the report (profile with --set full or --section SourceCounters)")
    reasons = _stall_sums(insts)
    regions = []
    for a in range(0, len(insts), region):
        chunk = insts[a:a + region]
        s = sum(i["samples"] for i in chunk)
        if s / total < min_share:
            continue
        why = _stall_sums(chunk)
        ops: dict[str, int] = {}
        for i in chunk:
            op = opcode(i["source"])
            if op:
                ops[op] = ops.get(op, 0) + 1
        regions.append({"first": a, "last": a + len(chunk) - 1, "share": s / total,
                        "reasons": {k: v / total for k, v in sorted(why.items(), key=lambda kv: -kv[1])[:3]},
                        "opcodes": dict(sorted(ops.items(), key=lambda kv: -kv[1])[:6])})
    ranked = sorted(range(len(insts)), key=lambda n: -insts[n]["samples"])[:top]
    return {"samples": total, "instructions": len(insts),
            "reasons": {k: v / total for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])},
            "regions": regions,
            "top": [{"index": n, "source": insts[n]["source"], "share": insts[n]["samples"] / total,
                     "reasons": dict(sorted(insts[n]["stalls"].items(), key=lambda kv: -kv[1])[:3])} for n in ranked]}


def render(kernel: str, s: dict) -> str:
    pct = lambda x: f"{100 * x:.1f}%"  # noqa: E731
    lines = [f"{kernel or 'kernel'}: {s['samples']:.0f} samples over {s['instructions']} SASS instructions",
             "reasons: " + ", ".join(f"{k} {pct(v)}" for k, v in s["reasons"].items() if v >= 0.005), "",
             "| instructions | samples | top reasons | opcodes |", "|---|---|---|---|"]
    for r in s["regions"]:
        lines.append(f"| {r['first']}-{r['last']} | {pct(r['share'])} | "
                     + ", ".join(f"{k} {pct(v)}" for k, v in r["reasons"].items()) + " | "
                     + ", ".join(f"{k} {n}" for k, n in r["opcodes"].items()) + " |")
    lines += ["", "top instructions:"]
    lines += [f"  {pct(t['share']):>6}  {t['index']:5d}  {t['source'][:80]}" for t in s["top"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="`ncu --import R.ncu-rep --page source --csv --print-source sass` output")
    ap.add_argument("--region", type=int, default=250, help="instructions a region (default 250)")
    ap.add_argument("--top", type=int, default=20, help="instructions listed (default 20)")
    ap.add_argument("--json", default=None, help="also write the summary here")
    args = ap.parse_args(argv)
    try:
        kernel, insts = read_source_csv(args.csv)
        s = summarize(insts, args.region, args.top)
    except (OSError, ValueError) as e:
        print(f"ncu_stalls: {e}", file=sys.stderr)
        return 2
    print(render(kernel, s))
    if args.json:
        Path(args.json).write_text(json.dumps({"kernel": kernel, **s}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
