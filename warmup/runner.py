"""Parallel warmup: compile a plan's missing variants with worker processes, or share it across TP ranks.

Every compile publishes atomically into the artifact store (per-key lock, manifest last), so a run
can be interrupted at any point and rerun: finished variants are found in the store and skipped.
"""
from __future__ import annotations

import logging
import math
import multiprocessing as mp
import os
import sys
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence, TextIO

from dsv4_jit.errors import ConfigError, Dsv4JitError

from .planner import Plan, PlannedVariant, store_has

log = logging.getLogger("dsv4_jit.warmup")


# ---- how many workers -----------------------------------------------------------------------------

def _cgroup_v2_limit() -> float | None:
    """CPU limit from cgroup v2 `cpu.max` of this process's cgroup and its ancestors (smallest wins)."""
    try:
        rel = None
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                rel = line[3:].strip()
        if rel is None:
            return None
        base = Path("/sys/fs/cgroup")
        d = (base / rel.lstrip("/")).resolve()
        best = None
        while True:
            f = d / "cpu.max"
            if f.is_file():
                quota, _, period = f.read_text().strip().partition(" ")
                if quota != "max" and period:
                    lim = int(quota) / int(period)
                    best = lim if best is None else min(best, lim)
            if d == base or base not in d.parents:
                break
            d = d.parent
        return best
    except (OSError, ValueError):
        return None


def _cgroup_v1_limit() -> float | None:
    for d in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"):
        try:
            quota = int(Path(d, "cpu.cfs_quota_us").read_text())
            period = int(Path(d, "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        if quota > 0 and period > 0:
            return quota / period
    return None


def available_cpus() -> int:
    """CPUs this process may really use: affinity mask, capped by a cgroup CPU quota (containers)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = _cgroup_v2_limit()
    if quota is None:
        quota = _cgroup_v1_limit()
    if quota is not None:
        n = min(n, max(1, math.ceil(quota)))
    return max(1, n)


# ---- worker side --------------------------------------------------------------------------------------

def _init_worker(store_spec: dict | None, log_path: str | None = None) -> None:
    # Workers ignore Ctrl-C: the parent decides what to cancel and reports it.
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if log_path:
        # TileLang and TVM warn from C++ straight to fd 2 (advice for kernel authors); results and
        # errors travel back through the pool, so the worker's stderr can go to the log whole.
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 2)
        os.close(fd)
    if store_spec:
        from dsv4_jit.cache_tools.store import Store
        from dsv4_jit.jit import set_default_store
        set_default_store(Store(store_spec["root"], layers=store_spec.get("layers")))


def compile_task(spec_name: str, variant: Any) -> dict:
    """Default worker job: compile one variant into the default store (no-op if it is there).
    `waited`: another process was building it; this one waited on its lock and took its entry."""
    from dsv4_jit import jit
    from dsv4_jit.spec import get_spec
    _quiet_tilelang()
    spec = get_spec(spec_name)
    store = jit.default_store()
    if store_has(store, jit.artifact_key(spec, variant)):
        return {"status": "cached"}
    before = jit.COUNTERS.compiles
    jit.compile_variant(spec, variant, caller="dsv4-jit warmup")
    if jit.COUNTERS.compiles == before:
        return {"status": "cached", "waited": True}
    return {"status": "compiled"}


_QUIETED = False


def _quiet_tilelang() -> None:
    """TileLang logs two INFO lines per compile; with N workers that buries the progress output."""
    global _QUIETED
    if not _QUIETED and not os.environ.get("DSV4_JIT_VERBOSE"):
        import tilelang  # noqa: F401  (its import sets its logger to INFO; override after)
        logging.getLogger("tilelang").setLevel(logging.WARNING)
        _QUIETED = True


def _run_task(fn: Callable, spec_name: str, variant: Any) -> dict:
    t0 = time.perf_counter()
    try:
        out = dict(fn(spec_name, variant) or {})
        out.setdefault("status", "compiled")
    except BaseException as e:  # noqa: BLE001 - report every failure, keep the other workers going
        msg = f"{type(e).__name__}: {e}"
        out = {"status": "failed", "error": msg.strip(), "trace": traceback.format_exc(limit=6)}
    out["seconds"] = time.perf_counter() - t0
    return out


# ---- progress ---------------------------------------------------------------------------------------------

class Progress:
    """A one-line bar with ETA on a TTY; plain lines otherwise (CI logs, pipes)."""

    def __init__(self, total: int, jobs: int, out: TextIO | None = None, tty: bool | None = None,
                 enabled: bool = True):
        self.total, self.jobs, self.done = total, jobs, 0
        self.out = out or sys.stderr
        self.tty = self.out.isatty() if tty is None else tty
        self.enabled = enabled
        self.t0 = time.monotonic()
        self.busy: list[float] = []

    def eta(self) -> float | None:
        if not self.busy:
            return None
        per = sum(self.busy) / len(self.busy)
        return math.ceil((self.total - self.done) / max(1, self.jobs)) * per

    def update(self, name: str, status: str, seconds: float) -> None:
        self.done += 1
        if status == "compiled":
            self.busy.append(seconds)
        if not self.enabled:
            return
        eta = self.eta()
        eta_s = "?" if eta is None else _fmt_dur(eta)
        if self.tty:
            width = 28
            fill = int(width * self.done / max(1, self.total))
            line = (f"\r[{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} "
                    f"{100 * self.done // max(1, self.total):3d}%  elapsed {_fmt_dur(time.monotonic() - self.t0)}"
                    f"  ETA {eta_s}  {status} {name[:40]}")
            self.out.write(line.ljust(118)[:160])
            if self.done == self.total:
                self.out.write("\n")
        else:
            self.out.write(f"[{self.done}/{self.total}] {status:8} {name} ({seconds:.1f} s, ETA {eta_s})\n")
        self.out.flush()

    def finish(self) -> None:
        if self.enabled and self.tty and self.done != self.total:
            self.out.write("\n")
            self.out.flush()


def _fmt_dur(s: float) -> str:
    s = int(round(s))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


# ---- the parallel run -------------------------------------------------------------------------------------

@dataclass
class TaskResult:
    key: str
    label: str
    arch: str
    name: str
    status: str            # compiled | cached | failed | not_done
    seconds: float = 0.0
    error: str = ""
    waited: bool = False   # cached because another process built it while this one waited on its lock


@dataclass
class WarmupReport:
    results: list[TaskResult] = field(default_factory=list)
    seconds: float = 0.0
    jobs: int = 1
    interrupted: bool = False
    budget_hit: bool = False
    export: dict | None = None
    not_persisted: list[str] = field(default_factory=list)   # compiled, but gone with a worker's temp dir
    compiler_log: dict | None = None                          # {"path", "lines"} the compiler wrote there

    def count(self, status: str) -> int:
        return sum(1 for r in self.results if r.status == status)

    @property
    def waited(self) -> int:
        return sum(1 for r in self.results if r.waited)

    @property
    def ok(self) -> bool:
        return (not self.interrupted and not self.not_persisted
                and all(r.status in ("compiled", "cached") for r in self.results))

    def rows(self) -> list[dict]:
        """Per arch x kernel use: variants, compiled, cached, failed, not done, seconds."""
        rows: dict[tuple[str, str], dict] = {}
        for r in self.results:
            row = rows.setdefault((r.arch, r.label), {"arch": r.arch, "kernel": r.label, "variants": 0,
                                                      "compiled": 0, "cached": 0, "failed": 0,
                                                      "not_done": 0, "seconds": 0.0})
            row["variants"] += 1
            row[r.status] += 1
            row["seconds"] += r.seconds
        for row in rows.values():
            row["seconds"] = round(row["seconds"], 2)
        return [rows[k] for k in sorted(rows)]

    def to_dict(self) -> dict:
        return {"ok": self.ok, "seconds": round(self.seconds, 2), "jobs": self.jobs,
                "interrupted": self.interrupted, "time_budget_hit": self.budget_hit,
                "totals": {**{s: self.count(s) for s in ("compiled", "cached", "failed", "not_done")},
                           "built_by_another_process": self.waited,
                           "persisted": self.count("compiled") - len(self.not_persisted)},
                "not_persisted": list(self.not_persisted), "compiler_log": self.compiler_log,
                "kernels": self.rows(),
                "failures": [{"key": r.key, "name": r.name, "error": r.error} for r in self.results
                             if r.status == "failed"],
                "export": self.export}


def _store_spec(store) -> dict | None:
    root = getattr(store, "root", None)
    if root is None:
        return None
    layers = [str(l.root) for l in getattr(store, "read_only", []) if getattr(l, "root", None)]
    return {"root": str(root), "layers": layers}


def check_run_limits(jobs: int | None, time_budget: float | None) -> None:
    """-j and --time-budget, checked before anything is planned or compiled."""
    if jobs is not None and jobs < 1:
        raise ConfigError(f"-j/--jobs must be >= 1, got {jobs}")
    if time_budget is not None and time_budget <= 0:
        raise ConfigError(f"--time-budget must be > 0 seconds, got {time_budget}")


def run_warmup(plan: Plan, *, jobs: int | None = None, time_budget: float | None = None, store=None,
               compile_fn: Callable[[str, Any], dict] = compile_task, mp_context: str | None = "spawn",
               progress: Progress | None = None, quiet: bool = False,
               clock: Callable[[], float] = time.monotonic, log_path: str | None = None) -> WarmupReport:
    """Compile every planned variant missing from `store` with `jobs` worker processes.

    Variants already in the store count as cached. With `time_budget` (seconds) no compile starts
    after the budget; those are `not_done`. Ctrl-C cancels what has not started, keeps what finished,
    and re-raises KeyboardInterrupt after filling in the report (available as `exc.report`). With
    `log_path`, the workers' stderr (the compiler's own warnings) is appended there."""
    if store is None:
        from dsv4_jit.jit import default_store
        store = default_store()
    jobs = jobs or available_cpus()
    check_run_limits(jobs, time_budget)
    t0 = clock()
    report = WarmupReport(jobs=jobs)

    def res(v: PlannedVariant, status: str, seconds: float = 0.0, error: str = "") -> TaskResult:
        return TaskResult(v.key, v.labels[0], v.arch, v.name, status, seconds, error)

    todo: list[PlannedVariant] = []
    for v in plan.variants:
        if store_has(store, v.key):
            report.results.append(res(v, "cached"))
        else:
            todo.append(v)
    prog = progress or Progress(len(todo), jobs, enabled=not quiet)
    if not todo:
        report.seconds = clock() - t0
        return report

    ctx = mp.get_context(mp_context) if mp_context else None
    ex = ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=ctx,
                             initializer=_init_worker, initargs=(_store_spec(store), log_path))
    pending: dict[Future, PlannedVariant] = {}
    queue = list(todo)
    try:
        while queue or pending:
            # Keep at most `jobs` in flight so the time budget can stop new starts.
            while queue and len(pending) < jobs:
                if time_budget is not None and clock() - t0 >= time_budget:
                    report.budget_hit = True
                    break
                v = queue.pop(0)
                pending[ex.submit(_run_task, compile_fn, v.spec.name, v.variant)] = v
            if report.budget_hit and not pending:
                break
            if not pending:
                break
            done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
            for fut in done:
                v = pending.pop(fut)
                try:
                    out = fut.result()
                except BaseException as e:  # noqa: BLE001 - a worker died (OOM, segfault in nvcc...)
                    out = {"status": "failed", "error": f"worker died: {type(e).__name__}: {e}", "seconds": 0.0}
                r = res(v, out["status"], out.get("seconds", 0.0), out.get("error", ""))
                r.waited = bool(out.get("waited"))
                report.results.append(r)
                if r.status == "failed":
                    log.error("compile failed: %s: %s", v.name, r.error)
                    if out.get("trace"):
                        log.debug("%s", out["trace"])
                prog.update(v.name, r.status, r.seconds)
            if report.budget_hit and not queue:
                continue
        for v in queue:
            report.results.append(res(v, "not_done"))
    except KeyboardInterrupt as e:
        report.interrupted = True
        for fut, v in pending.items():
            fut.cancel()
            report.results.append(res(v, "not_done"))
        for v in queue:
            report.results.append(res(v, "not_done"))
        procs = list((getattr(ex, "_processes", None) or {}).values())
        ex.shutdown(wait=False, cancel_futures=True)
        _terminate_workers(procs)
        prog.finish()
        report.seconds = clock() - t0
        e.report = report  # type: ignore[attr-defined]
        raise
    ex.shutdown(wait=True)
    prog.finish()
    # A worker whose cache dir went bad mid-run (disk full, remounted read-only) kept its builds in a
    # temp dir that died with it: what this process cannot see was not kept.
    report.not_persisted = [r.key for r in report.results
                            if r.status == "compiled" and not store_has(store, r.key)]
    report.seconds = clock() - t0
    return report


def _terminate_workers(procs: list) -> None:
    # A compile interrupted mid-way leaves only a staging dir, never a half-published entry.
    for p in procs:
        try:
            p.terminate()
        except Exception:  # noqa: BLE001
            pass


# ---- inside an engine: share the work across TP ranks ------------------------------------------------------

def _dist_ready() -> bool:
    try:
        import torch.distributed as dist
        return dist.is_available() and dist.is_initialized()
    except Exception:  # noqa: BLE001
        return False


def warmup_in_engine(plan: Plan, *, rank: int = 0, world_size: int = 1, seal_mode: str | None = "warn",
                     store=None, arch: str | None = None, timeout: float = 1800.0, poll: float = 0.05,
                     max_poll: float = 2.0, use_dist: bool | None = None) -> dict:
    """Each rank compiles its share (keys sorted, `i % world_size == rank`), all wait, all load, seal.

    Waiting: `torch.distributed.barrier()` when a process group is initialised; otherwise each rank
    polls the store for the others' keys with backoff up to `timeout`, and builds any key still missing
    itself (the store's per-key lock makes it wait for, not duplicate, a build in progress)."""
    from dsv4_jit import jit
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"rank={rank} / world_size={world_size}: need 0 <= rank < world_size")
    store = store or jit.default_store()
    here = arch or jit.current_arch().name
    mine_arch = [v for v in plan.variants if v.arch == here]
    if not mine_arch:
        raise ConfigError(f"the plan has no variants for this GPU's arch {here} (plan archs: "
                          f"{', '.join(plan.archs)}); build the plan with --arch {here}")
    t0 = time.monotonic()
    ordered = sorted(mine_arch, key=lambda v: v.key)
    share = [v for i, v in enumerate(ordered) if i % world_size == rank]
    failures: list[str] = []
    compiled = 0
    for v in share:
        if store.lookup(v.key) is not None:
            continue
        try:
            jit.compile_variant(v.spec, v.variant, store, caller=f"warmup rank {rank}")
            compiled += 1
        except Dsv4JitError as e:
            failures.append(f"{v.name}: {e}")
    t_compile = time.monotonic() - t0

    dist = _dist_ready() if use_dist is None else use_dist
    if dist and world_size > 1:
        import torch.distributed as tdist
        tdist.barrier()
    else:
        others = [v for v in ordered if v not in share]
        _wait_for(others, store, timeout=timeout, poll=poll, max_poll=max_poll)
    t_wait = time.monotonic() - t0 - t_compile

    loaded = 0
    for v in ordered:
        jit.load(v.spec, v.variant, store, caller=f"warmup rank {rank}")
        loaded += 1
    if seal_mode:
        jit.seal(seal_mode)
    return {"rank": rank, "world_size": world_size, "arch": here, "share": len(share), "compiled": compiled,
            "loaded": loaded, "failures": failures, "seconds_compile": round(t_compile, 3),
            "seconds_wait": round(t_wait, 3), "seconds": round(time.monotonic() - t0, 3),
            "sealed": seal_mode}


def _wait_for(variants: Sequence[PlannedVariant], store, *, timeout: float, poll: float, max_poll: float) -> None:
    """Poll the store for keys other ranks build; past the timeout, build what is still missing."""
    from dsv4_jit import jit
    left = {v.key: v for v in variants}
    deadline = time.monotonic() + timeout
    delay = poll
    while left and time.monotonic() < deadline:
        for k in [k for k in left if store.lookup(k) is not None]:
            del left[k]
        if left:
            time.sleep(delay)
            delay = min(max_poll, delay * 1.5)
    for v in left.values():
        log.warning("warmup: %s not built by its rank within %.0f s; building it here", v.name, timeout)
        jit.compile_variant(v.spec, v.variant, store, caller="warmup (slow rank)")


# ---- the CLI command ---------------------------------------------------------------------------------------

def format_report(report: WarmupReport) -> str:
    rows = report.rows()
    w = max([len("kernel")] + [len(r["kernel"]) for r in rows])   # whole names, never cut
    head = f"{'arch':8} {'kernel':{w}} {'variants':>8} {'compiled':>8} {'cached':>6} {'failed':>6} {'not done':>8} {'seconds':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['arch']:8} {r['kernel']:{w}} {r['variants']:>8} {r['compiled']:>8} {r['cached']:>6} "
                     f"{r['failed']:>6} {r['not_done']:>8} {r['seconds']:>8.1f}")
    lines.append("-" * len(head))
    t = {s: report.count(s) for s in ("compiled", "cached", "failed", "not_done")}
    waited = f" ({report.waited} built by another process while this one waited on its lock)" if report.waited else ""
    lines.append(f"total {len(report.results)}: {t['compiled']} compiled, {t['cached']} cached{waited}, "
                 f"{t['failed']} failed, {t['not_done']} not done in {_fmt_dur(report.seconds)} "
                 f"with {report.jobs} worker(s)")
    return "\n".join(lines)


def export_plan_bundle(plan: Plan, dest: str, store, report: WarmupReport | None = None) -> dict:
    from dsv4_jit.cache_tools.bundle import export_bundle   # lazily: tarfile and lzma only when exporting
    from dsv4_jit.toolchain import toolchain_fingerprint
    coverage = plan.coverage()
    if report is not None:
        coverage["not_built"] = sorted(r.key for r in report.results if r.status in ("failed", "not_done"))
    # the plan's entries only: a store that served other models, families or older kernel code has entries the
    # image does not need (and stale ones it could never load)
    return export_bundle(store, dest, toolchain_fingerprint(), archs=plan.archs, keys=coverage["keys"],
                         coverage=coverage)


def run_warmup_cli(args, model, shapes, archs, reason: str, notes: list[str]) -> int:
    import json
    from .planner import build_plan, format_table, select_families
    out = sys.stderr
    plan = build_plan(model, shapes, [a.name for a in archs], arch_reason=reason,
                      families=select_families(getattr(args, "family", None)))
    plan.notes[:0] = notes
    store = _persistent_store()
    if args.export:
        from dsv4_jit.cache_tools.bundle import check_export_dest
        check_export_dest(args.export)   # before any compile: a bad path must not cost a whole warmup
    jobs = args.jobs or available_cpus()
    print(f"archs: {', '.join(plan.archs)} ({reason})", file=out)
    if not any(a.name == getattr(_gpu(), "name", None) for a in archs):
        print("no local GPU for these archs: cross-compiling (nothing is launched)", file=out)
    print(f"engine: {shapes.summary()}", file=out)
    for n in plan.notes:
        print(f"note: {n}", file=out)
    missing = sum(1 for v in plan.variants if not store_has(store, v.key))
    print(f"plan: {plan.compiles} variants ({plan.naive_compiles} if one per capture size); {missing} to compile "
          f"with {jobs} worker(s), estimated {_fmt_dur(plan.estimate_seconds(jobs, missing))}", file=out)
    log_path = _compiler_log(store)
    log_start = _size(log_path)
    try:
        report = run_warmup(plan, jobs=jobs, time_budget=args.time_budget, store=store, quiet=args.json,
                            log_path=log_path)
    except KeyboardInterrupt as e:
        rep = getattr(e, "report", None)
        if rep is not None:
            print(format_report(rep), file=out)
            print(f"interrupted: {rep.count('compiled') + rep.count('cached')} built variants are kept; "
                  f"rerun the same command to finish", file=out)
        raise
    if args.export:
        try:
            report.export = export_plan_bundle(plan, args.export, store, report)
        except Dsv4JitError as e:
            report.export = {"error": str(e)}
    report.compiler_log = _log_summary(log_path, log_start)
    lost = ""
    if report.not_persisted:
        why = store.degraded_reason or f"a worker could not write {store.root}"
        lost = (f"{len(report.not_persisted)} compiled variants were not kept ({why}); "
                "point DSV4_JIT_CACHE_DIR at a writable directory and rerun")
    if args.json:
        print(json.dumps({"plan": {"compiles": plan.compiles, "naive_compiles": plan.naive_compiles,
                                   "archs": plan.archs, "model": plan.model, "engine": shapes.to_dict()},
                          "report": report.to_dict()}, indent=1))
    else:
        print(format_report(report))
        for r in report.results:
            if r.status == "failed":
                print(f"FAILED {r.name}: {r.error}")
        if report.budget_hit:
            print(f"time budget of {args.time_budget:g} s reached: {report.count('not_done')} variants not started; "
                  f"rerun to finish (built variants are kept)")
        if report.export:
            e = report.export
            if e.get("error"):
                print(f"export failed: {e['error']}")
            else:
                print(f"exported {e.get('entries')} entries to {e.get('dest')}")
        if report.compiler_log:
            print(f"compiler warnings: {report.compiler_log['lines']} lines in {log_path} (-v shows them here)",
                  file=out)
    if lost:
        print(f"dsv4-jit: error: {lost}", file=sys.stderr)
    if report.export and report.export.get("error"):
        return 1
    return 0 if report.ok else 1


def _compiler_log(store) -> str | None:
    """<cache dir>/logs/compile.log for the compiler's own warnings; None with -v (they stay on the
    terminal) or where no log can be written."""
    if os.environ.get("DSV4_JIT_VERBOSE") or getattr(store, "root", None) is None:
        return None
    d = Path(store.root) / "logs"
    try:
        d.mkdir(mode=0o700, exist_ok=True)
        return str(d / "compile.log")
    except OSError:
        return None


def _size(path: str | None) -> int:
    try:
        return os.path.getsize(path) if path else 0
    except OSError:
        return 0


def _log_summary(path: str | None, start: int) -> dict | None:
    """{"path", "lines"} of what this run appended to the compiler log, None if nothing."""
    if not path or _size(path) <= start:
        return None
    with open(path, "rb") as f:
        f.seek(start)
        lines = f.read().count(b"\n")
    return {"path": path, "lines": lines}


def _persistent_store():
    """The default store, or a one-line error if nothing built into it would outlive this process."""
    import warnings
    from dsv4_jit.cache_tools.errors import CacheWarning
    from dsv4_jit.jit import default_store
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)   # the error below says it, once
        store = default_store()
    if hasattr(store, "require_persistent"):
        store.require_persistent("warm up")
    return store


def _gpu():
    from dsv4_jit.arch import detect_arch
    return detect_arch()
