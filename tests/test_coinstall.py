"""dsv4-jit installs into the environment vLLM 0.33.0 creates without moving any of vLLM's pins.

vLLM 0.33.0 pins tilelang==0.1.12, apache-tvm-ffi==0.1.11 and torch==2.14.0. pip's own resolver decides:
vLLM's requirements (read from its published metadata by `pip install --dry-run --report`, never copied)
become constraints, and dsv4-jit's whole dependency closure must resolve inside them, landing exactly on
vLLM's pins. dsv4-jit's closure is tilelang, torch, filelock and platformdirs; tilelang and torch sit in
vLLM's own closure at those pins, so this is the joint resolution. scripts/coinstall_check.sh runs the full
`dsv4-jit[vllm]` + vLLM resolution and a real install beside vLLM's pins.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VLLM = "vllm==0.33.0"
# vLLM 0.33.0's pins that dsv4-jit's closure shares; the resolution must land on each of them
SHARED_PINS = ("tilelang", "apache-tvm-ffi", "torch")


def _pip_report(args: list[str], tmp_path: Path) -> tuple[subprocess.CompletedProcess, dict]:
    report = tmp_path / f"report-{len(list(tmp_path.glob('report-*')))}.json"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                        "--report", str(report), *args], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    return r, (json.loads(report.read_text()) if r.returncode == 0 else {})


def _installed(report: dict) -> dict[str, str]:
    from packaging.utils import canonicalize_name
    return {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in report["install"]}


@pytest.fixture(scope="module")
def vllm_requirements(tmp_path_factory) -> list[str]:
    """vLLM 0.33.0's Requires-Dist as published (a local wheel at $DSV4_JIT_VLLM_WHEEL, else the index)."""
    src = os.environ.get("DSV4_JIT_VLLM_WHEEL") or VLLM
    r, rep = _pip_report(["--no-deps", src], tmp_path_factory.mktemp("vllm-meta"))
    assert r.returncode == 0, r.stderr[-2000:]
    (item,) = rep["install"]
    assert (item["metadata"]["name"], item["metadata"]["version"]) == ("vllm", "0.33.0")
    return item["metadata"]["requires_dist"]


def _constraints(requires_dist: list[str]) -> list[str]:
    """Each requirement that applies here (no extra, this platform) as a constraint: name and specifier."""
    from packaging.requirements import Requirement
    out = []
    for line in requires_dist:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if req.specifier:
            out.append(f"{req.name}{req.specifier}")
    return out


def test_vllm_pins_the_toolchain_dsv4_jit_shares(vllm_requirements):
    pins = {c.split("==")[0].lower(): c.split("==")[1] for c in _constraints(vllm_requirements) if "==" in c}
    assert {p: pins.get(p) for p in SHARED_PINS} == {"tilelang": "0.1.12", "apache-tvm-ffi": "0.1.11",
                                                      "torch": "2.14.0"}


def test_dsv4_jit_resolves_inside_vllm_pins(vllm_requirements, tmp_path):
    """pip resolves dsv4-jit with vLLM 0.33.0's requirements as constraints, onto exactly vLLM's pins."""
    cons = tmp_path / "vllm-0.33.0-constraints.txt"
    lines = _constraints(vllm_requirements)
    cons.write_text("\n".join(lines) + "\n")
    r, rep = _pip_report(["-c", str(cons), str(REPO)], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    got = _installed(rep)
    assert got["dsv4-jit"]
    pinned = {c.split("==")[0].lower(): c.split("==")[1] for c in lines if "==" in c}
    assert {p: got.get(p) for p in SHARED_PINS} == {p: pinned[p] for p in SHARED_PINS}
    # nothing dsv4-jit pulls in leaves any of vLLM's constraints
    from packaging.requirements import Requirement
    for line in lines:
        req = Requirement(line)
        name = req.name.lower().replace("_", "-")
        if name in got:
            assert req.specifier.contains(got[name], prereleases=True), (line, got[name])


def test_the_previous_tilelang_floor_cannot_resolve_inside_vllm_pins(vllm_requirements, tmp_path):
    """The check discriminates: TileLang >= 0.1.15 (what dsv4-jit required before) conflicts with vLLM 0.33.0."""
    cons = tmp_path / "vllm-0.33.0-constraints.txt"
    cons.write_text("\n".join(_constraints(vllm_requirements)) + "\n")
    r, _ = _pip_report(["--no-deps", "-c", str(cons), "tilelang>=0.1.15,<0.1.16"], tmp_path)
    assert r.returncode != 0
    assert "tilelang" in (r.stderr + r.stdout).lower()


def test_declared_tilelang_range_is_the_tested_releases():
    """0.1.12 (vLLM 0.33's) and 0.1.15, nothing untested in between."""
    import tomllib
    from packaging.requirements import Requirement
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (tl,) = [Requirement(d) for d in deps if Requirement(d).name == "tilelang"]
    candidates = [f"0.1.{n}" for n in range(10, 18)]
    assert [v for v in candidates if tl.specifier.contains(v)] == ["0.1.12", "0.1.15"]
