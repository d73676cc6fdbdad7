"""The container recipe (examples/container/) on CPU: its build stage and runtime stage as two fresh
cache directories, running exactly the `dsv4-jit` command lines the Dockerfile runs (parsed from it, with
the build args a small test plan needs), so the recipe cannot drift from what is tested here."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def run_cli(*argv: str, env: dict, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "dsv4_jit", *argv], env=env, capture_output=True, text=True,
                         timeout=timeout)
    if check and out.returncode != 0:
        raise AssertionError(f"dsv4-jit {' '.join(argv)} -> {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out


def clean_env(tmp_path, cache) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSV4_JIT_")}
    env.update(DSV4_JIT_CACHE_DIR=str(cache), XDG_CACHE_HOME=str(tmp_path / "xdg"))
    return env


# ---- --family: the smallest real plan the CLI offers -------------------------------------------------

def test_family_filter_narrows_the_plan(tmp_path):
    env = clean_env(tmp_path, tmp_path / "cache")
    eng = ["--vllm-args", "--max-num-seqs 1 --max-num-batched-tokens 1 --enforce-eager"]
    full = json.loads(run_cli("plan", "--arch", "sm_120a", "--json", *eng, env=env).stdout)
    from dsv4_jit.family import all_families
    names = sorted(all_families())
    assert {"mhc", "attention", "indexer"} <= set(names)
    per = {}
    for fam in names:
        p = json.loads(run_cli("plan", "--arch", "sm_120a", "--family", fam, "--json", *eng, env=env).stdout)
        per[fam] = {v["key"] for v in p["variants"]}
        assert per[fam] and any("--family" in n for n in p["notes"])
    assert set().union(*per.values()) == {v["key"] for v in full["variants"]}
    both = json.loads(run_cli("plan", "--arch", "sm_120a", "--family", "mhc,attention", "--json", *eng, env=env).stdout)
    assert {v["key"] for v in both["variants"]} == per["mhc"] | per["attention"]
    # "all" is the default; an unknown family is a one-line error naming the known ones
    alls = json.loads(run_cli("plan", "--arch", "sm_120a", "--family", "all", "--json", *eng, env=env).stdout)
    assert alls["totals"] == full["totals"]
    bad = run_cli("plan", "--family", "nope", env=env, check=False)
    assert bad.returncode == 1 and f"known: {', '.join(names)} (or all)" in bad.stderr and "Traceback" not in bad.stderr


# ---- the Dockerfile, parsed -----------------------------------------------------------------------------

import re
import shlex
import shutil
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "examples" / "container" / "Dockerfile"
# The smallest real plan: the attention family (3 variants on sm_120a) of an eager engine at one token.
SMALL_ARGS = {"DSV4_FAMILY": "attention", "VLLM_ARGS": "--max-num-seqs 1 --max-num-batched-tokens 1 --enforce-eager"}


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) per Dockerfile instruction: comments dropped, `\\` continuations joined."""
    out, cur = [], ""
    for line in text.splitlines():
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if cur and line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        cur += line
        word, _, rest = cur.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        cur = ""
    return out


def _expand(text: str, env: dict) -> str:
    """Shell expansion of the forms the Dockerfile uses: "$V" / "${V}" stay one word, bare $V splits."""
    env = {**os.environ, **env}   # variables the base image defines (PATH) come from the host here
    text = re.sub(r'"\$\{?(\w+)\}?"', lambda m: shlex.quote(env[m.group(1)]), text)
    return re.sub(r"\$\{?(\w+)\}?", lambda m: env[m.group(1)], text)


def _assignments(rest: str, env: dict) -> dict:
    out = {}
    for word in shlex.split(rest):
        k, _, v = word.partition("=")
        out[k] = _expand(v, {**env, **out})
    return out


def stages(text: str, args: dict, remap: tuple[str, str] | None = None) -> dict[str, list]:
    """Per stage: the steps docker would run, as ("run"|"cmd", [argv, ...], env) with ARG defaults
    overridden by `args` (docker build --build-arg) and ("copy", src, dst). `remap` rewrites a path
    prefix in ARG/ENV values (/opt/dsv4-jit -> a test dir)."""
    def fix(v: str) -> str:
        return v.replace(remap[0], remap[1]) if remap else v
    result: dict[str, list] = {}
    steps: list | None = None
    env: dict = {}
    envs: dict[str, dict] = {}
    for ins, rest in _instructions(text):
        if ins == "FROM":
            parts = rest.split()
            steps = result.setdefault(parts[-1] if len(parts) >= 3 and parts[-2].upper() == "AS" else parts[0], [])
            env = dict(envs.get(parts[0], {}))    # FROM <stage> inherits that stage's ENV
            envs[parts[-1]] = env
        elif ins == "ARG":
            name, _, default = rest.partition("=")
            env[name] = fix(args.get(name, shlex.split(default)[0] if default else ""))
        elif ins == "ENV":
            env.update({k: fix(v) for k, v in _assignments(rest, env).items()})
        elif ins in ("RUN", "CMD") and steps is not None:
            cmds = [shlex.split(_expand(seg, env)) for seg in rest.split("&&")]
            steps.append((ins.lower(), cmds, dict(env)))
        elif ins == "COPY" and steps is not None and rest.startswith("--from="):
            _, src, dst = shlex.split(_expand(rest, env))
            steps.append(("copy", src, dst))
    return result


def test_dockerfile_runs_the_tested_commands():
    """What the recipe runs, checked without compiling: the build stage's one dsv4-jit call is a CPU warmup
    for sm_120a with --export, the runtime imports, checks, and checks again before `vllm serve` with the
    same engine flags; every dsv4-jit argv parses with the real CLI parser (no made-up flag)."""
    from dsv4_jit.cli import build_parser
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG CUDA_IMAGE=nvidia/cuda:13\.[0-9.]+-devel-", text, re.M)  # nvcc 13, no GPU needed
    assert "torch==2.13.0" in text and "tilelang==0.1.15" in text
    st = stages(text, {})
    dsv4 = {name: [c for kind, cmds, _ in steps if kind in ("run", "cmd") for c in cmds if c[0] == "dsv4-jit"]
            for name, steps in st.items()}
    assert dsv4["toolchain"] == []
    (warm,) = dsv4["build"]
    assert warm[:2] == ["dsv4-jit", "warmup"] and warm[warm.index("--arch") + 1] == "sm_120a" and "--export" in warm
    imp, chk, chk_at_start = dsv4["runtime"]
    assert imp[:3] == ["dsv4-jit", "cache", "import"] and imp[3] == warm[warm.index("--export") + 1]
    assert chk[:2] == ["dsv4-jit", "check"] and chk == chk_at_start
    plan_opts = lambda argv: [a for a in argv[2:] if a != "--export" and a != warm[warm.index("--export") + 1]]
    assert plan_opts(chk) == plan_opts(warm)   # the runtime checks the very plan the build stage compiled
    kind, cmds, env = [s for s in st["runtime"] if s[0] == "cmd"][0]
    assert cmds[0] == chk and cmds[1][:3] == ["exec", "vllm", "serve"]
    assert cmds[1][4:] == shlex.split(chk[chk.index("--vllm-args") + 1])   # vllm gets the flags check planned
    assert env["DSV4_JIT_CACHE_LAYERS"] == imp[imp.index("--cache-dir") + 1] and "DSV4_JIT_CACHE_DIR" not in env
    for argv in dsv4["build"] + dsv4["runtime"]:
        build_parser().parse_args(argv[1:])
    # the test below substitutes only build args: the same commands, a smaller plan
    small = stages(text, SMALL_ARGS)
    assert [c[:2] for c in (small["build"][0][1][0],)] == [warm[:2]]


def _tree(root: Path) -> dict:
    import hashlib
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


ZERO_COMPILE_CHILD = textwrap.dedent("""
    import json, shlex, sys
    import tilelang
    from tilelang.jit.kernel import JITKernel
    def trap(*a, **k): raise SystemExit("TileLang front end was used")
    tilelang.compile = trap; tilelang.lower = trap; JITKernel.__init__ = trap
    from dsv4_jit import jit
    from dsv4_jit.warmup.engines import resolve_shapes
    from dsv4_jit.warmup.planner import build_plan
    model, arch, family, vllm_args = sys.argv[1:5]
    shapes, _ = resolve_shapes(vllm_args=shlex.split(vllm_args), sglang_args=None, profile=None, gpu_memory_gib=None)
    plan = build_plan(model, shapes, [arch], families=[family])
    for v in plan.variants:
        jit.load(v.spec, v.variant)
    c = jit.counters()
    print(json.dumps({"planned": plan.compiles, "loads": c["loads"], "compiles": c["compiles"]}))
""")


def _zero_compiles(env: dict) -> dict:
    r = subprocess.run([sys.executable, "-c", ZERO_COMPILE_CHILD, env["DSV4_MODEL"], env["DSV4_ARCH"],
                        env["DSV4_FAMILY"], env["VLLM_ARGS"]], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    c = json.loads(r.stdout.strip().splitlines()[-1])
    assert c["compiles"] == 0 and c["loads"] == c["planned"] > 0, c
    return c


def _serve(directory: Path):
    import functools
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a):
            pass
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(directory)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.mark.compile
def test_recipe_build_stage_then_runtime_stage(tmp_path):
    """Stage 1 (a fresh dir, CPU only) and stage 2 (another fresh dir) run the Dockerfile's own command
    lines with a small plan; the runtime loads every planned kernel with zero compiles, from the
    read-only layer (left untouched), from a plain import, and from the bundle served over HTTP."""
    import time
    st = stages(DOCKERFILE.read_text(), SMALL_ARGS)
    roots = {name: tmp_path / name for name in ("build", "runtime")}
    base = {k: v for k, v in os.environ.items() if not k.startswith("DSV4_JIT_")}

    def stage_env(name: str, env: dict) -> dict:
        # each stage is a fresh filesystem: /opt/dsv4-jit and the user cache dir live under its own root
        out = dict(base, XDG_CACHE_HOME=str(roots[name] / "home" / ".cache"))
        out.update({k: v.replace("/opt/dsv4-jit", str(roots[name] / "opt" / "dsv4-jit")) for k, v in env.items()})
        return out

    def run_stage(name: str, *, cmd: bool) -> tuple[list, dict]:
        ran, last_env = [], {}
        for step in st[name]:
            if step[0] == "copy":
                src, dst = (Path(p.replace("/opt/dsv4-jit", str(roots[r] / "opt" / "dsv4-jit")))
                            for p, r in ((step[1], "build"), (step[2], name)))
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(src, dst)
                continue
            kind, cmds, env = step
            if (kind == "cmd" and not cmd) or not any(c[0] == "dsv4-jit" for c in cmds):
                continue    # image setup (apt, venv, pip): this test's own environment stands for it
            env = last_env = stage_env(name, env)
            for argv in cmds:
                argv = [a.replace("/opt/dsv4-jit", str(roots[name] / "opt" / "dsv4-jit")) for a in argv]
                if argv[0] == "dsv4-jit":
                    t0 = time.monotonic()
                    out = run_cli(*argv[1:], env=env)
                    ran.append((argv, round(time.monotonic() - t0, 1), out))
                elif argv[:3] == ["exec", "vllm", "serve"]:
                    ran.append((argv, 0.0, None))       # the one step CI cannot take: no GPU, no vLLM
                else:
                    assert argv[0] in ("chmod", "rm"), argv
                    subprocess.run(argv, check=True, env=env, timeout=60)
        return ran, last_env

    build_ran, build_env = run_stage("build", cmd=False)
    (warm, secs, out), = build_ran
    assert "sm_120a" in warm and "cross-compiling" in out.stderr and "exported 3 entries" in out.stdout, out.stdout
    bundle = Path(warm[warm.index("--export") + 1])
    kept = tmp_path / "kept.tar.gz"
    shutil.copy(bundle, kept)                            # the runtime stage removes its copy

    runtime_ran, env = run_stage("runtime", cmd=True)
    argvs = [r[0] for r in runtime_ran]
    assert [a[:3] for a in argvs] == [["dsv4-jit", "cache", "import"], ["dsv4-jit", "check", "--model"],
                                      ["dsv4-jit", "check", "--model"], ["exec", "vllm", "serve"]]
    assert "3 installed" in runtime_ran[0][2].stdout
    assert all("covered: all 3 planned variants" in r[2].stdout for r in runtime_ran[1:3])
    layer = Path(env["DSV4_JIT_CACHE_LAYERS"])
    assert not (roots["runtime"] / "opt" / "dsv4-jit" / "dsv4-jit-bundle.tar.gz").exists()
    before = _tree(layer)
    _zero_compiles(env)
    assert _tree(layer) == before                        # read-only layer: nothing written into it

    # the other runtime shape: import straight into the (fresh) writable cache, no layer
    plain = dict(env, DSV4_JIT_CACHE_DIR=str(tmp_path / "plain" / "cache"))
    plain.pop("DSV4_JIT_CACHE_LAYERS")
    imp = [a for a in argvs[0] if a not in ("--cache-dir", argvs[0][argvs[0].index("--cache-dir") + 1])]
    run_cli(*imp[1:3], str(kept), env=plain)
    chk = argvs[1][1:]
    assert run_cli(*chk, env=plain).returncode == 0
    _zero_compiles(plain)

    # and from an artifact server: check the bundle's coverage and import it over http from 127.0.0.1
    srv = _serve(tmp_path)
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/kept.tar.gz"
        remote = dict(plain, DSV4_JIT_CACHE_DIR=str(tmp_path / "remote" / "cache"))
        assert "covered" in run_cli(*chk, "--bundle", url, env=remote).stdout
        assert run_cli(*chk, env=remote, check=False).returncode == 1      # not imported yet
        run_cli("cache", "import", url, env=remote)
        assert run_cli(*chk, env=remote).returncode == 0
    finally:
        srv.shutdown()
        srv.server_close()
    print(f"warmup {secs} s; runtime steps {[r[1] for r in runtime_ran]} s")
