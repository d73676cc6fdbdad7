"""benchmarks/ncu_stalls.py on a small CSV shaped like `ncu --page source --csv --print-source sass` output."""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import ncu_stalls  # noqa: E402

REASONS = ["barrier", "long_sb", "short_sb", "wait"]


def _write(path: Path, insts: list[tuple[str, dict]]) -> Path:
    hdr = (["Address", "Source", ncu_stalls.SAMPLES, "Warp Stall Sampling (Not-issued Samples)", "# Samples"]
           + [f"stall_{r}" for r in REASONS] + [f"stall_{r} (Not Issued)" for r in REASONS])
    with path.open("w", newline="") as f:
        w = csv.writer(f, quoting=csv.QUOTE_ALL)
        w.writerow(["Kernel Name", "toy_kernel", ""])
        w.writerow(hdr)
        for n, (src, st) in enumerate(insts):
            total = sum(st.values())
            w.writerow([hex(0x1000 + 16 * n), f"      {src}", str(total), str(total), str(total)]
                       + [str(st.get(r, 0)) for r in REASONS] + ["0"] * len(REASONS))
    return path


def test_shares_regions_and_top_instructions(tmp_path):
    insts = [("LDG.E R2, [R4.64]", {}), ("@P0 BAR.SYNC.DEFER_BLOCKING 0x0", {"barrier": 30}),
             ("FMUL R3, R2, R5", {"long_sb": 50}), ("@!P1 LDS.128 R8, [R13+0x600]", {"short_sb": 15, "wait": 5})]
    kernel, rows = ncu_stalls.read_source_csv(_write(tmp_path / "k.csv", insts))
    assert kernel == "toy_kernel" and len(rows) == 4
    assert rows[3] == {"source": "@!P1 LDS.128 R8, [R13+0x600]", "samples": 20.0, "stalls": {"short_sb": 15.0, "wait": 5.0}}
    s = ncu_stalls.summarize(rows, region=2, top=2)
    assert s["samples"] == 100 and s["instructions"] == 4
    assert s["reasons"] == {"long_sb": 0.5, "barrier": 0.3, "short_sb": 0.15, "wait": 0.05}
    assert [(r["first"], r["last"], r["share"]) for r in s["regions"]] == [(0, 1, 0.3), (2, 3, 0.7)]
    assert s["regions"][1]["opcodes"] == {"FMUL": 1, "LDS": 1}
    assert [(t["index"], t["share"]) for t in s["top"]] == [(2, 0.5), (1, 0.3)]
    assert ncu_stalls.opcode("@!P1 LDS.128 R8, [R13]") == "LDS" and ncu_stalls.opcode("") == ""


def test_cli_prints_and_writes_json(tmp_path, capsys):
    path = _write(tmp_path / "k.csv", [("HMMA.16816.F32.BF16 R0, R4, R8, R0", {"wait": 3}), ("EXIT", {"barrier": 1})])
    assert ncu_stalls.main([str(path), "--region", "1", "--json", str(tmp_path / "s.json")]) == 0
    out = capsys.readouterr().out
    assert "toy_kernel: 4 samples over 2 SASS instructions" in out and "wait 75.0%" in out
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["kernel"] == "toy_kernel" and doc["top"][0]["source"].startswith("HMMA")


def test_bad_input_is_a_clear_error(tmp_path, capsys):
    other = tmp_path / "details.csv"
    other.write_text('"ID","Kernel Name","Metric Name"\n"0","k","Duration"\n')
    assert ncu_stalls.main([str(other)]) == 2
    assert "no header with 'Source'" in capsys.readouterr().err
    empty = _write(tmp_path / "e.csv", [("NOP", {})])
    assert ncu_stalls.main([str(empty)]) == 2
    assert "no stall samples" in capsys.readouterr().err
    with pytest.raises(ValueError, match="region must be"):
        ncu_stalls.summarize([{"source": "NOP", "samples": 1.0, "stalls": {}}], region=0)
