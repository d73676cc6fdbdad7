"""The wheel holds every package: the hand-kept `packages` list in pyproject.toml (top-level kernels/, warmup/
and cache_tools/ installed as dsv4_jit.*) matches the tree, and a wheel built from it, installed alone into a
fresh venv, imports every registered family and every module."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "README.md", "dsv4_jit", "kernels", "warmup", "cache_tools")


def _setuptools_table() -> dict:
    import tomllib
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def _tree_packages(package_dir: dict[str, str]) -> set[str]:
    """Every dir holding an __init__.py under each mapped root, as the dotted name it installs under."""
    found = set()
    for dotted, root in package_dir.items():
        for init in (REPO / root).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / root)
            if "__pycache__" in rel.parts:
                continue
            found.add(".".join([dotted, *rel.parts]))
    return found


def test_packages_list_matches_the_tree():
    table = _setuptools_table()
    listed = set(table["packages"])
    top = {d: r for d, r in table["package-dir"].items() if d.count(".") <= 1}
    tree = _tree_packages(top)
    assert tree - listed == set(), f"packages missing from pyproject.toml [tool.setuptools] packages: {tree - listed}"
    assert listed - tree == set(), f"pyproject.toml lists packages that do not exist: {listed - tree}"
    # kernels/, warmup/ and cache_tools/ install under dsv4_jit.*: never a top-level `kernels` package
    assert all(p == "dsv4_jit" or p.startswith("dsv4_jit.") for p in listed)


_PROBE = textwrap.dedent("""
    import importlib, json, pkgutil, sys
    import dsv4_jit
    from dsv4_jit.family import all_families
    from dsv4_jit.model_config import load_model_config
    mods = []
    for pkg in ("dsv4_jit.kernels", "dsv4_jit.warmup", "dsv4_jit.cache_tools"):
        p = importlib.import_module(pkg)
        for m in pkgutil.walk_packages(p.__path__, pkg + "."):
            importlib.import_module(m.name)
            mods.append(m.name)
    files = sorted({m.__file__ for n, m in sys.modules.items() if n.split(".")[0] == "dsv4_jit"})
    print(json.dumps({"file": dsv4_jit.__file__, "families": sorted(all_families()), "modules": mods, "files": files,
                      "flash_layers": load_model_config("deepseek-v4-flash").num_hidden_layers}))
""")


def _site_packages(venv: Path) -> Path:
    return next(venv.glob("lib/python*/site-packages"))


def test_wheel_installed_alone_imports_every_family(tmp_path):
    import torch
    import tilelang
    from dsv4_jit.family import all_families
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:   # a copy: building writes build/ and *.egg-info beside the sources
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, src / name)
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    str(src)], check=True, capture_output=True, timeout=300)
    wheel = next(wheels.glob("dsv4_jit-*.whl"))

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = _site_packages(venv)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site),
                    str(wheel)], check=True, capture_output=True, timeout=300)
    # torch and TileLang from wherever this interpreter has them, as plain paths: a .pth line adds a dir but
    # does not process the .pth files in it, so no editable install of dsv4_jit there can answer an import
    deps = {str(Path(m.__file__).parent.parent) for m in (torch, tilelang)}
    (site / "zz_test_deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(DSV4_JIT_CACHE_DIR=str(tmp_path / "cache"), XDG_CACHE_HOME=str(tmp_path / "xdg"))
    py = venv / "bin" / "python"
    r = subprocess.run([str(py), "-c", _PROBE], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert Path(got["file"]).is_relative_to(site), got["file"]        # the wheel's copy, not this checkout
    assert [f for f in got["files"] if not Path(f).is_relative_to(site)] == []
    assert got["families"] == sorted(all_families()) and len(got["families"]) >= 7
    kernel_pkgs = {m for m in got["modules"] if m.count(".") == 2 and m.startswith("dsv4_jit.kernels.")}
    assert kernel_pkgs == {f"dsv4_jit.kernels.{d.name}" for d in (REPO / "kernels").iterdir()
                           if (d / "__init__.py").is_file()}
    assert got["flash_layers"] > 0                                    # package data (embedded model configs)
