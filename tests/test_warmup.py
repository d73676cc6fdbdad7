"""The warmup runner (worker processes, time budget, rerun), in-engine sharing, and the CLI plumbing."""
from __future__ import annotations

import io
import json
import os
import sys
import tarfile
import threading

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_planner import USES, DirStore, fake_compile, fake_key  # noqa: E402

from dsv4_jit.errors import ConfigError  # noqa: E402
from dsv4_jit.warmup import vllm_shapes  # noqa: E402
from dsv4_jit.warmup import runner  # noqa: E402
from dsv4_jit.warmup.planner import build_plan  # noqa: E402
from dsv4_jit.warmup.runner import Progress, available_cpus, format_report, run_warmup, warmup_in_engine  # noqa: E402


def small_plan(archs=("sm_120a",), mnbt=300):
    shapes = vllm_shapes(max_num_seqs=64, max_num_batched_tokens=mnbt)
    return build_plan("deepseek-v4-flash", shapes, list(archs), uses=USES, key_fn=fake_key)


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("WARMUP_FAKE_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("WARMUP_FAKE_SLEEP", "0")
    return DirStore(tmp_path / "store")


def test_available_cpus():
    n = available_cpus()
    assert 1 <= n <= len(os.sched_getaffinity(0))


def test_cgroup_v2_quota(tmp_path, monkeypatch):
    # /proc/self/cgroup says "0::/job"; /sys/fs/cgroup/job/cpu.max = 1.5 CPUs -> 2 workers at most
    root = tmp_path / "sys_fs_cgroup"
    (root / "job").mkdir(parents=True)
    (root / "job" / "cpu.max").write_text("150000 100000\n")
    (root / "cpu.max").write_text("max 100000\n")
    real_path = runner.Path

    def fake_path(p, *rest):
        p = str(p)
        if p == "/proc/self/cgroup":
            f = tmp_path / "cgroup"
            f.write_text("0::/job\n")
            return real_path(f, *rest)
        if p == "/sys/fs/cgroup":
            return real_path(root, *rest)
        return real_path(p, *rest)
    monkeypatch.setattr(runner, "Path", fake_path)
    assert runner._cgroup_v2_limit() == 1.5
    monkeypatch.setattr(runner.os, "sched_getaffinity", lambda pid: set(range(16)))
    assert runner.available_cpus() == 2


def test_run_warmup_compiles_caches_and_reports_failures(store):
    plan = small_plan()
    # blocks 16/64/128 for two step statics + one const: the block=64 variants "fail"
    first = plan.variants[0]
    store.add(first.key)                                 # one already cached
    rep = run_warmup(plan, jobs=2, store=store, compile_fn=fake_compile, quiet=True)
    by = {r.key: r.status for r in rep.results}
    assert len(by) == plan.compiles and by[first.key] == "cached"
    fails = [v for v in plan.variants if v.variant.p.get("block") == 64]
    assert fails and all(by[v.key] == "failed" for v in fails)
    assert not rep.ok and rep.count("compiled") == plan.compiles - 1 - len(fails)
    assert all("nvcc exploded" in r.error for r in rep.results if r.status == "failed")
    d = rep.to_dict()
    assert d["totals"]["failed"] == len(fails) and json.dumps(d)
    assert "failed" in format_report(rep)
    # rerun: successes are kept, only the failures are retried
    rep2 = run_warmup(plan, jobs=2, store=store, compile_fn=fake_compile, quiet=True)
    assert rep2.count("cached") == plan.compiles - len(fails) and rep2.count("failed") == len(fails)


def test_time_budget_stops_new_starts(store, monkeypatch):
    monkeypatch.setenv("WARMUP_FAKE_SLEEP", "0.3")
    plan = small_plan(archs=("sm_120a", "sm_90a", "sm_100a"))
    ok = [v for v in plan.variants if v.variant.p.get("block") != 64]
    assert len(ok) >= 6
    rep = run_warmup(plan, jobs=1, time_budget=0.2, store=store, compile_fn=fake_compile, quiet=True,
                     mp_context="fork")
    assert rep.budget_hit and rep.count("not_done") > 0 and not rep.ok
    done = rep.count("compiled") + rep.count("failed")
    assert 1 <= done < plan.compiles


def test_bad_runner_args(store):
    with pytest.raises(ConfigError, match="--time-budget"):
        run_warmup(small_plan(), jobs=1, time_budget=0, store=store, compile_fn=fake_compile)


def test_progress_plain_and_tty():
    out = io.StringIO()
    p = Progress(2, 1, out=out, tty=False)
    p.update("k1", "compiled", 3.0)
    p.update("k2", "failed", 1.0)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[1/2] compiled k1 (3.0 s, ETA 3s)") and lines[1].startswith("[2/2] failed")
    out = io.StringIO()
    p = Progress(2, 1, out=out, tty=True)
    p.update("k1", "compiled", 2.0)
    assert out.getvalue().startswith("\r[##############..............] 1/2  50%") and "ETA 2s" in out.getvalue()


# ---- inside an engine -------------------------------------------------------------------------------------

class FakeJit:
    def __init__(self):
        self.compiled, self.loaded, self.sealed = [], [], []
        self.lock = threading.Lock()

    def install(self, monkeypatch):
        from dsv4_jit import jit
        monkeypatch.setattr(jit, "compile_variant", self.compile_variant)
        monkeypatch.setattr(jit, "load", self.load)
        monkeypatch.setattr(jit, "seal", lambda mode: self.sealed.append(mode))

    def compile_variant(self, spec, variant, store, caller=""):
        with self.lock:
            self.compiled.append(fake_key(spec, variant))
        store.add(fake_key(spec, variant))

    def load(self, spec, variant, store, caller=""):
        assert store.lookup(fake_key(spec, variant)) is not None
        with self.lock:
            self.loaded.append(fake_key(spec, variant))


def test_warmup_in_engine_shares_work(store, monkeypatch):
    fj = FakeJit()
    fj.install(monkeypatch)
    plan = small_plan(archs=("sm_90a", "sm_120a"))
    mine = [v.key for v in plan.variants if v.arch == "sm_90a"]
    results = [None, None, None]

    def rank(r):
        results[r] = warmup_in_engine(plan, rank=r, world_size=3, store=store, arch="sm_90a", use_dist=False,
                                      timeout=10, poll=0.01)
    ts = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert sorted(fj.compiled) == sorted(mine)              # each key built once, by its owner
    assert sorted(fj.loaded) == sorted(mine * 3)            # every rank loads everything for its arch
    assert fj.sealed == ["warn"] * 3
    assert sum(r["share"] for r in results) == len(mine)


def test_warmup_in_engine_builds_what_a_slow_rank_missed(store, monkeypatch):
    fj = FakeJit()
    fj.install(monkeypatch)
    plan = small_plan()
    out = warmup_in_engine(plan, rank=0, world_size=2, store=store, arch="sm_120a", use_dist=False,
                           timeout=0.05, poll=0.01)              # rank 1 never shows up
    assert sorted(fj.compiled) == sorted(plan.keys()) and out["loaded"] == plan.compiles


def test_warmup_in_engine_errors(store):
    with pytest.raises(ConfigError, match="rank=2 / world_size=2"):
        warmup_in_engine(small_plan(), rank=2, world_size=2, store=store, arch="sm_120a")
    with pytest.raises(ConfigError, match="no variants for this GPU's arch sm_90a"):
        warmup_in_engine(small_plan(), store=store, arch="sm_90a")


# ---- CLI ------------------------------------------------------------------------------------------------------

def _parse(argv):
    from dsv4_jit.cli import build_parser
    from dsv4_jit.warmup.cli import _normalise
    args = build_parser().parse_args(argv)
    _normalise(args)
    return args


def test_cli_engine_args_forms():
    a = _parse(["plan", "--vllm-args", "--max-num-seqs 256 -tp 2"])
    assert a.vllm_args == ["--max-num-seqs", "256", "-tp", "2"]
    a = _parse(["plan", "--json", "--vllm-args", "--max-num-seqs", "256", "--arch", "sm_90a", "-O",
                '{"cudagraph_capture_sizes": [1, 2]}', "--json"])
    assert a.vllm_args == ["--max-num-seqs", "256", "-O", '{"cudagraph_capture_sizes": [1, 2]}']
    assert a.arch == "sm_90a" and a.json
    a = _parse(["warmup", "-j", "3", "--sglang-args=--enable-dp-attention"])
    assert a.sglang_args == ["--enable-dp-attention"] and a.jobs == 3


@pytest.fixture
def fake_planner(monkeypatch):
    from dsv4_jit import jit
    from dsv4_jit.warmup import planner
    monkeypatch.setattr(planner, "_default_uses", lambda model, shapes, families=None: USES)
    monkeypatch.setattr(jit, "artifact_key", fake_key)


def test_cli_plan_json(fake_planner, capsys):
    from dsv4_jit.cli import main
    rc = main(["plan", "--arch", "sm_90a", "--json", "--vllm-args", "vllm serve deepseek-ai/DeepSeek-V4-Pro "
               "--max-num-seqs 64 --max-num-batched-tokens 300"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["model"] == "deepseek-v4-pro" and d["archs"] == ["sm_90a"]
    assert d["totals"]["compiles"] == 7 and d["totals"]["naive_compiles"] == 19 * len(USES)
    rc = main(["plan", "--arch", "sm_90a", "--vllm-args", "--max-num-seqs 64 --max-num-batched-tokens 300"])
    out = capsys.readouterr().out
    assert rc == 0 and "distinct compiles: 7" in out and "from --arch" in out


def test_cli_tp_the_model_cannot_split_is_one_line_naming_the_family(capsys):
    """64 heads over TP 3: plan, check and warmup print which family cannot serve it, exit 1, no traceback."""
    from dsv4_jit.cli import main
    for cmd in ("plan", "check", "warmup"):
        assert main([cmd, "--arch", "sm_120a", "--vllm-args", "-tp 3"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("dsv4-jit: error: ") and err.count("\n") == 1
        assert "kernels cannot serve deepseek-v4-flash at tensor-parallel size 3" in err and "64 heads" in err
    # a family's statics error reaches library callers as a ConfigError, still a ValueError, naming the family
    from dsv4_jit.family import all_families, family_uses
    from dsv4_jit.model_config import ParallelConfig, load_model_config
    with pytest.raises(ConfigError, match=r"^gemm kernels cannot serve deepseek-v4-pro at tensor-parallel size 3: "
                                          r"num_attention_heads=128 is not divisible"):
        family_uses([all_families()["gemm"]], load_model_config("deepseek-v4-pro"), ParallelConfig(tp_size=3))


def test_cli_bad_limits_fail_before_planning(capsys):
    """-j 0 and a non-positive --time-budget fail before the plan is built or printed."""
    from dsv4_jit.cli import main
    for argv, msg in ((["warmup", "--arch", "sm_120a", "--time-budget", "-5"], "--time-budget must be > 0"),
                      (["plan", "-j", "0"], "-j/--jobs must be >= 1")):
        assert main(argv) == 1
        out, err = capsys.readouterr()
        assert out == "" and err.startswith(f"dsv4-jit: error: {msg}") and err.count("\n") == 1


def test_cli_check_bundle(fake_planner, tmp_path, capsys, monkeypatch):
    import hashlib
    from dsv4_jit import jit
    from dsv4_jit.cli import main
    # bundle manifests hold sha256 keys: hash the readable fake keys the same way on both sides
    hexed = lambda k: hashlib.sha256(k.encode()).hexdigest()  # noqa: E731
    monkeypatch.setattr(jit, "artifact_key", lambda spec, v: hexed(fake_key(spec, v)))
    plan = small_plan(archs=("sm_90a",))
    bundle = tmp_path / "b.tar.gz"

    def write(keys):
        keys = [hexed(k) for k in keys]
        from dsv4_jit.cache_tools.bundle import BUNDLE_KIND, FORMAT_VERSION
        blob = "0" * 64  # a well-formed manifest; check reads only the manifest, never the blobs
        raw = json.dumps({"format_version": FORMAT_VERSION, "kind": BUNDLE_KIND, "producer": {}, "blobs": {blob: 1},
                          "entries": [{"key": k, "fields": {}, "files": {"kernel.so": {"sha256": blob, "size": 1}}}
                                      for k in keys]}).encode()
        with tarfile.open(bundle, "w:gz") as tf:
            ti = tarfile.TarInfo("manifest.json")
            ti.size = len(raw)
            tf.addfile(ti, io.BytesIO(raw))
    argv = ["check", "--arch", "sm_90a", "--bundle", str(bundle), "--vllm-args",
            "--max-num-seqs 64 --max-num-batched-tokens 300"]
    write(plan.keys())
    assert main(argv) == 0 and "covered" in capsys.readouterr().out
    write(plan.keys()[1:])
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "NOT covered: 1 of 7" in out
    assert main(argv[:3] + ["--bundle", str(tmp_path / "nope.tar")] + argv[5:]) == 1
    assert "--bundle: no such file" in capsys.readouterr().err


# ---- what warmup reports is what happened -----------------------------------------------------------------

def store_compile(spec_name, variant):
    """Worker job over a real Store (the worker's default store): one build per key, counted as the store counts."""
    import hashlib
    from dsv4_jit import jit
    key = hashlib.sha256(f"{spec_name}:{json.dumps(variant.key_fields(), sort_keys=True)}".encode()).hexdigest()

    def build(staging):
        (staging / "kernel.so").write_bytes(b"\x7fELF" + key.encode())
    jit.default_store().get_or_build(key, {"kernel": spec_name, "arch": variant.arch}, build)
    return {"status": "compiled"}


def noisy_compile(spec_name, variant):
    """Worker job that writes to fd 2 as TileLang's C++ passes do, then 'compiles' into $WARMUP_FAKE_STORE."""
    from test_planner import DirStore
    os.write(2, f"Buffer read before initialization in {spec_name}\n".encode())
    DirStore(os.environ["WARMUP_FAKE_STORE"]).add(f"{spec_name}:{json.dumps(variant.key_fields(), sort_keys=True)}")
    return {"status": "compiled"}


def _hex_plan():
    import hashlib
    shapes = vllm_shapes(max_num_seqs=64, max_num_batched_tokens=300)
    return build_plan("deepseek-v4-flash", shapes, ["sm_120a"], uses=USES,
                      key_fn=lambda s, v: hashlib.sha256(fake_key(s, v).encode()).hexdigest())


def test_stats_after_warmup_count_one_miss_per_compile(tmp_path, isolated_cache):
    from dsv4_jit.cache_tools import Store
    plan = _hex_plan()
    store = Store(tmp_path / "cache", layers=[])
    rep = run_warmup(plan, jobs=2, store=store, compile_fn=store_compile, quiet=True)
    assert rep.ok and rep.count("compiled") == plan.compiles and rep.to_dict()["totals"]["persisted"] == plan.compiles
    rep2 = run_warmup(plan, jobs=2, store=store, compile_fn=store_compile, quiet=True)
    assert rep2.count("cached") == plan.compiles
    store.flush_stats()
    st = Store(tmp_path / "cache", layers=[]).stats()["layers"][0]
    assert st["entries"] == plan.compiles and (st["misses"], st["hits"]) == (plan.compiles, 0)


def test_waiting_on_another_process_is_reported_as_such(monkeypatch, tmp_path, isolated_cache):
    from dsv4_jit import jit
    from dsv4_jit.cache_tools import Store
    jit.set_default_store(Store(tmp_path / "cache", layers=[]))
    monkeypatch.setattr(jit, "artifact_key", lambda spec, v: "a" * 64)
    variant = small_plan().variants[0].variant

    def built_here(spec, v, *a, **k):
        jit.COUNTERS.compiles += 1

    try:
        monkeypatch.setattr(jit, "compile_variant", built_here)
        assert runner.compile_task("mhc_post", variant) == {"status": "compiled"}
        # the store's per-key lock: the peer built it while this worker waited, so nothing compiled here
        monkeypatch.setattr(jit, "compile_variant", lambda *a, **k: None)
        assert runner.compile_task("mhc_post", variant) == {"status": "cached", "waited": True}
    finally:
        jit.set_default_store(None)
    rep = runner.WarmupReport(results=[runner.TaskResult("k1", "step.a", "sm_120a", "v1", "compiled"),
                                       runner.TaskResult("k2", "step.a", "sm_120a", "v2", "cached", waited=True)])
    assert "1 compiled, 1 cached (1 built by another process while this one waited on its lock)" in format_report(rep)
    assert rep.to_dict()["totals"]["built_by_another_process"] == 1


def test_compiles_a_worker_could_not_keep_fail_the_run(store):
    plan = small_plan()

    class ForgetfulStore(type(store)):
        """A worker's cache dir went bad mid-run: the last compiled variant never reached it."""
        def contains(self, key):
            return key != plan.variants[-1].key and self.lookup(key) is not None
    rep = run_warmup(plan, jobs=1, store=ForgetfulStore(store.path), compile_fn=noisy_compile, quiet=True)
    assert rep.count("compiled") == plan.compiles and rep.not_persisted == [plan.variants[-1].key]
    assert not rep.ok and rep.to_dict()["totals"]["persisted"] == plan.compiles - 1


def test_compiler_warnings_go_to_the_log_not_the_terminal(store, tmp_path, capfd):
    plan = small_plan()
    log = tmp_path / "compile.log"
    rep = run_warmup(plan, jobs=2, store=store, compile_fn=noisy_compile, quiet=True, log_path=str(log))
    assert rep.count("compiled") == plan.compiles
    assert "Buffer read before" not in capfd.readouterr().err
    assert log.read_text().count("Buffer read before initialization") == plan.compiles
    assert runner._log_summary(str(log), 0) == {"path": str(log), "lines": plan.compiles}
    # -v (no log): the same warnings reach the terminal
    for f in store.path.iterdir():
        f.unlink()
    run_warmup(plan, jobs=1, store=store, compile_fn=noisy_compile, quiet=True)
    assert capfd.readouterr().err.count("Buffer read before initialization") == plan.compiles


def test_compiler_log_lives_under_the_cache_dir_and_verbose_skips_it(tmp_path, monkeypatch, isolated_cache):
    from dsv4_jit.cache_tools import Store
    s = Store(tmp_path / "cache", layers=[])
    monkeypatch.delenv("DSV4_JIT_VERBOSE", raising=False)
    assert runner._compiler_log(s) == str(tmp_path / "cache" / "logs" / "compile.log")
    monkeypatch.setenv("DSV4_JIT_VERBOSE", "1")
    assert runner._compiler_log(s) is None


def test_warmup_into_an_unwritable_cache_fails_before_compiling(tmp_path, monkeypatch, capsys, isolated_cache):
    from dsv4_jit import jit
    from dsv4_jit.cli import main
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("DSV4_JIT_CACHE_DIR", str(blocker / "cache"))
    jit.set_default_store(None)
    compiled = []
    monkeypatch.setattr(runner, "run_warmup", lambda *a, **k: compiled.append(1))
    try:
        for argv in (["warmup", "--arch", "sm_90a"], ["warmup", "--arch", "sm_90a", "--json"]):
            assert main(argv) == 1
            out, err = capsys.readouterr()
            assert out == "" and err.count("\n") == 1 and not compiled
            assert err.startswith(f"dsv4-jit: error: cannot warm up: cache dir {blocker / 'cache'} is not writable")
            assert "so nothing would be kept; point DSV4_JIT_CACHE_DIR at a writable directory" in err
    finally:
        jit.set_default_store(None)


def test_warmup_export_path_is_checked_before_compiling(tmp_path, monkeypatch, capsys, isolated_cache):
    from dsv4_jit import jit
    from dsv4_jit.cli import main
    monkeypatch.setenv("DSV4_JIT_CACHE_DIR", str(tmp_path / "cache"))
    jit.set_default_store(None)
    compiled = []
    monkeypatch.setattr(runner, "run_warmup", lambda *a, **k: compiled.append(1))
    try:
        for dest, msg in ((tmp_path, "is a directory"), ("/proc/no/such.tar.gz", "cannot write bundle")):
            assert main(["warmup", "--arch", "sm_90a", "--export", str(dest)]) == 1
            err = capsys.readouterr().err
            assert err.startswith("dsv4-jit: error: ") and msg in err and err.count("\n") == 1 and not compiled
    finally:
        jit.set_default_store(None)


@pytest.mark.parametrize("flags,named", [
    ([], ["--max-num-seqs", "--max-num-batched-tokens"]),
    (["--max-num-seqs", "64"], ["--max-num-batched-tokens"]),
    (["--max-num-batched-tokens", "4096"], ["--max-num-seqs"]),
    (["--max-num-seqs", "64", "--max-num-batched-tokens", "4096"], []),
    (["--max-num-seqs", "64", "--gpu-memory-gib", "80"], []),
])
def test_vllm_gpu_class_note_names_only_the_flags_left_to_defaults(flags, named):
    from dsv4_jit.warmup.engines import resolve_shapes
    shapes, _ = resolve_shapes(vllm_args=["vllm", "serve", *flags])
    notes = [n for n in shapes.notes if "H100/H200 class" in n]
    if not named:
        assert notes == []
        return
    assert len(notes) == 1
    for flag in ("--max-num-seqs", "--max-num-batched-tokens"):
        assert (flag in notes[0]) == (flag in named), notes[0]
