"""scripts/ptxas_report.py: registers and spills of a hand-built variant, from ptxas, with no GPU."""
from __future__ import annotations

import importlib.util
from pathlib import Path


def test_reports_registers_of_a_variant(capsys):
    path = Path(__file__).resolve().parents[1] / "scripts" / "ptxas_report.py"
    spec = importlib.util.spec_from_file_location("ptxas_report", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rc = mod.main(["indexer_swa_indices", "sm_120a", '{"window": 128, "page_size": 64, "threads": 128}'])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "indexer_swa_indices" in out and "registers" in out and "spill" in out
