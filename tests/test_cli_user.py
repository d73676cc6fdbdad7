"""The CLI as a user meets it: every malformed invocation is one line on stderr with the right exit code and no
traceback; models are accepted by any name a user types; the README's engine example names real ops."""
from __future__ import annotations

import ast
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4_jit.cli import main
from dsv4_jit.errors import ConfigError
from dsv4_jit.model_config import load_model_config

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "dsv4_jit" / "model_configs"


@pytest.fixture
def cache_env(tmp_path, monkeypatch, isolated_cache):
    from dsv4_jit import jit
    monkeypatch.setenv("DSV4_JIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notabundle.tar.gz").write_text("hello")
    jit.set_default_store(None)
    yield tmp_path
    jit.set_default_store(None)


# (argv, exit code, text the one stderr line must hold). Every subcommand; none of these compiles anything.
MALFORMED = [
    ([], 2, "required: COMMAND"),
    (["bogus"], 2, "invalid choice"),
    (["info", "--bogus"], 2, "unrecognized arguments"),
    (["plan", "--arch", "sm_1"], 1, "unsupported arch"),
    (["plan", "--model", "nope"], 1, "unknown model 'nope'"),
    (["plan", "-j", "0"], 1, "-j/--jobs must be >= 1"),
    (["plan", "--gpu-memory-gib", "abc"], 2, "invalid float value"),
    (["plan", "--family", "nope"], 1, "unknown kernel family"),
    (["plan", "--profile", "/nonexistent.toml"], 1, "no such file"),
    (["plan", "--vllm-args", "--max-num-seqs 2 --served-model-name 'x"], 1, "no closing quotation"),
    (["plan", "--vllm-args", "--max-num-seqs", "abc"], 1, "invalid int value: 'abc'"),
    (["plan", "--vllm-args", "--max-num-seqs", "-5"], 1, "--max-num-seqs must be >= 1"),
    (["plan", "--sglang-args", "--cuda-graph-bs-decode", "a,b"], 1, "invalid int value: 'a,b'"),
    (["plan", "--sglang-args", "--cuda-graph-bs", "8"], 1, "ambiguous option: --cuda-graph-bs"),
    (["check", "--model", "/"], 1, "has no config.json"),
    (["check", "--bundle", "/nonexistent.tar.gz"], 1, "no such file"),
    (["check", "--bundle", "notabundle.tar.gz"], 1, "not a dsv4-jit bundle"),
    (["warmup", "-j", "x"], 2, "invalid int value"),
    (["warmup", "--time-budget", "0"], 1, "--time-budget must be > 0"),
    (["warmup", "--arch", "sm_90a", "--vllm-args", "-tp 3"], 1, "tensor-parallel size 3"),
    (["warmup", "--arch", "sm_90a", "--export", "/proc/no/such.tar.gz"], 1, "cannot write bundle"),
    (["cache"], 2, "required: COMMAND"),
    (["cache", "dir", "--cache-dir"], 2, "expected one argument"),
    (["cache", "ls", "--layer", "/nope"], 1, "is not a layer of this cache"),
    (["cache", "stats", "extra"], 2, "unrecognized arguments"),
    (["cache", "verify", "--bogus"], 2, "unrecognized arguments"),
    (["cache", "prune"], 2, "--max-size"),
    (["cache", "prune", "--max-size", "10X"], 1, "bad size"),
    (["cache", "prune", "--max-size", "0"], 1, "pass --yes"),
    (["cache", "clear"], 1, "pass --yes"),
    (["cache", "export", "/proc/x.tar.gz"], 1, "cannot write bundle /proc/x.tar.gz"),
    (["cache", "export", "/"], 1, "is a directory"),
    (["cache", "export", "b.tar.gz", "--coverage", "/nope.json"], 1, "cannot read coverage file"),
    (["cache", "import", "/nope.tar.gz"], 1, "bundle not found"),
    (["cache", "import", "notabundle.tar.gz"], 1, "not a dsv4-jit bundle"),
]


@pytest.mark.parametrize("argv,code,needle", MALFORMED, ids=[" ".join(a) or "(none)" for a, _, _ in MALFORMED])
def test_malformed_invocations_fail_in_one_line(cache_env, capsys, argv, code, needle):
    try:
        rc = main(argv)
    except SystemExit as e:   # argparse
        rc = e.code
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == code, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert re.match(r"dsv4-jit( [a-z]+)*: error: ", lines[0]) and needle in lines[0], lines[0]


@pytest.mark.parametrize("argv,needle", [
    (["plan", "--vllm-args", "--max-num-seqs 2 'x"], "no closing quotation"),
    (["cache", "export", "/proc/x.tar.gz"], "cannot write bundle"),
    (["warmup", "--arch", "sm_90a", "--export", "/proc/no/such.tar.gz"], "cannot write bundle"),
])
def test_reported_tracebacks_are_one_line_in_a_real_process(tmp_path, argv, needle):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSV4_JIT_")}
    env.update(DSV4_JIT_CACHE_DIR=str(tmp_path / "cache"), XDG_CACHE_HOME=str(tmp_path / "xdg"))
    r = subprocess.run([sys.executable, "-m", "dsv4_jit", *argv], env=env, text=True, capture_output=True,
                       timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and needle in r.stderr, r.stderr


# ---- names a user types ---------------------------------------------------------------------------

@pytest.mark.parametrize("name,expect", [
    ("deepseek-v4-flash", "deepseek-v4-flash"), ("DeepSeek-V4-Pro", "deepseek-v4-pro"),
    ("deepseek-ai/DeepSeek-V4-Flash", "deepseek-v4-flash"), ("deepseek-ai/DeepSeek-V4-Pro/", "deepseek-v4-pro"),
])
def test_model_names_hf_ids_and_short_names(name, expect):
    cfg = load_model_config(name)
    assert cfg.name == expect and cfg == load_model_config(expect)


def test_model_config_paths(tmp_path):
    pro = load_model_config("deepseek-v4-pro")
    d = tmp_path / "DeepSeek-V4-Pro-local"
    d.mkdir()
    (d / "config.json").write_text((CONFIGS / "deepseek-v4-pro.json").read_text())
    # a model dir and its config.json give the same numbers as the embedded config, named after the dir
    for given in (d, d / "config.json", str(d) + "/"):
        cfg = load_model_config(given)
        assert cfg.name == "DeepSeek-V4-Pro-local" and cfg.hidden_size == pro.hidden_size
    assert load_model_config(CONFIGS / "deepseek-v4-flash.json").name == "deepseek-v4-flash"
    (tmp_path / "bad.json").write_text("[1, 2]")
    for bad, msg in ((tmp_path / "bad.json", "JSON object"), (tmp_path, "has no config.json"),
                     ("someone/other-model", "unknown model"), ("", "empty")):
        with pytest.raises(ConfigError, match=msg):
            load_model_config(bad)


def test_model_flag_takes_the_hf_id_like_the_engine_flags(cache_env, capsys):
    import json
    assert main(["plan", "--arch", "sm_90a", "--json", "--family", "quant",
                 "--model", "deepseek-ai/DeepSeek-V4-Pro"]) == 0
    by_flag = json.loads(capsys.readouterr().out)
    assert main(["plan", "--arch", "sm_90a", "--json", "--family", "quant",
                 "--vllm-args", "vllm serve deepseek-ai/DeepSeek-V4-Pro"]) == 0
    by_engine = json.loads(capsys.readouterr().out)
    assert by_flag["model"] == by_engine["model"] == "deepseek-v4-pro"
    assert [v["key"] for v in by_flag["variants"]] == [v["key"] for v in by_engine["variants"]]


# ---- the README's engine example -------------------------------------------------------------------

def _engine_example() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("## In an engine", 1)[1]
    return section.split("```python", 1)[1].split("```", 1)[0]


def test_readme_engine_example_calls_real_ops_with_real_parameters():
    """Every dsv4_jit.NAME the example calls (or names in a comment) exists, and each call passes only
    parameters the op takes: the example runs as written on a GPU."""
    import dsv4_jit
    from dsv4_jit import kernels  # noqa: F401  (registers the families)
    code = _engine_example()
    for name in re.findall(r"\b([a-z_0-9]+_numel)\(", code):   # helpers named in comments
        assert hasattr(dsv4_jit, name), f"README names {name}, which dsv4_jit does not export"
    calls = [n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
             and n.func.value.id == "dsv4_jit"]
    assert len(calls) >= 8
    for c in calls:
        name = c.func.attr
        assert name in dsv4_jit.__all__, name
        target = _op_behind(name)
        kwargs = {k.arg: None for k in c.keywords}
        params = inspect.signature(target).parameters
        extra = {k: None for k in ("arch", "get_kernel") if k in params and k not in kwargs}   # the wrapper's
        inspect.signature(target).bind(*([None] * len(c.args)), **kwargs, **extra)   # TypeError if not


def _op_behind(name: str):
    """The kernels/*/ops.py function a dsv4_jit wrapper forwards to (the wrapper itself takes **kw)."""
    import importlib
    import dsv4_jit
    wrapper = getattr(dsv4_jit, name)
    src = inspect.getsource(wrapper)
    m = re.search(r"from \.kernels\.(\w+) import ops", src)
    takes_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(wrapper).parameters.values())
    if m is None or not takes_kw:   # a wrapper with its own full signature is what the caller binds to
        return wrapper
    return getattr(importlib.import_module(f"dsv4_jit.kernels.{m.group(1)}.ops"), name)


def test_sparse_mla_workspace_size_is_exported():
    import dsv4_jit
    from dsv4_jit.arch import get_profile
    from dsv4_jit.kernels.attention.ops import sparse_mla_workspace_numel
    for arch in ("sm_90a", "sm_120a"):
        n = dsv4_jit.sparse_mla_workspace_max_numel(64, 64, arch=arch)
        assert n == max(sparse_mla_workspace_numel(get_profile(arch), 64, t) for t in range(1, 65)) and n > 0


def test_verbose_before_or_after_the_command():
    from dsv4_jit.cli import build_parser
    p = build_parser()
    assert p.parse_args(["-v", "warmup"]).verbose and p.parse_args(["warmup", "--verbose"]).verbose
    assert not p.parse_args(["warmup"]).verbose and not p.parse_args(["plan"]).verbose
