"""What every family's benchmark shares: the copy bandwidth the %copy columns are measured against, the timers
(do_bench with L2 flushed, CUDA-graph replay, CUDA events), the error metrics, the JSON writer and the parallel
compile job the sweeps use.

Scripts import it as `benchmarks.harness` (each puts the repo root on sys.path, so `python
benchmarks/<family>/<script>.py` runs from the repo root). torch and triton are imported by the callers' GPU paths
only.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

def bench_us(fn) -> float:
    """Median of triton's do_bench (warmup 25 ms, rep 200 ms or DSV4_JIT_BENCH_REP_MS; L2 flushed before each call),
    in us. A shorter rep keeps a whole GPU pass inside one device call (the median of hundreds of replays)."""
    import os
    from triton.testing import do_bench
    rep = int(os.environ.get("DSV4_JIT_BENCH_REP_MS", "200"))
    return do_bench(fn, warmup=min(25, rep), rep=rep, return_mode="median") * 1e3


def copy_bandwidth_gbs() -> float:
    """Device-to-device copy of 256 MiB (read + write bytes / time): the bandwidth every benchmark's %copy
    column is measured against."""
    n = 256 * 1024 * 1024
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    return 2 * n / (bench_us(lambda: b.copy_(a)) * 1e-6) / 1e9


def graph_us(fn, reps: int = 20) -> float:
    """Kernel time without host overhead: `reps` calls captured in one CUDA graph, replayed."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    return bench_us(g.replay) / reps


def events_us(fn, launches: int) -> float:
    """Mean time of `launches` eager calls between two CUDA events, after one warm-up call (L2 warm, host overhead
    included): what the profiler launchers print when no profiler is attached."""
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(launches):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / launches


def graph_us_or_reason(fn, reps: int = 20) -> tuple[float | None, str | None]:
    """graph_us, or (None, why) when capture or replay fails: a peer that cannot be captured must
    not end the run. The device is synchronized again so that a failed capture leaves nothing behind."""
    try:
        return graph_us(fn, reps), None
    except Exception as e:  # any capture error: report it in the table
        reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]
    try:
        torch.cuda.synchronize()
    except Exception as e:  # a sticky CUDA error: later rows would fail too, so say so
        reason += f" (device left in error: {type(e).__name__})"
    return None, reason


def cold_us(fn) -> tuple[float, str | None]:
    """One call per graph replay, L2 flushed before it (kernel time without host overhead and without L2 reuse
    across calls), or eager do_bench with the reason where capture fails."""
    us, why = graph_us_or_reason(fn, reps=1)
    return (us, None) if us is not None else (bench_us(fn), f"eager ({why})")


def profiler_kernel_us(fn, name: str, launches: int = 20) -> float | None:
    """Mean GPU time of the kernels whose name starts with `name` over `launches` eager calls, from the torch
    profiler: a kernel's own time, next to a graph time that includes its neighbours."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(launches):
            fn()
        torch.cuda.synchronize()
    times = [e.device_time_total for e in prof.key_averages() if e.key.startswith(name)]
    return sum(times) / launches if times else None


def host_us(fn, n: int = 3000) -> float:
    """Host (wall) time per eager call, best of 3 runs of n calls after 50 warm-up calls: the Python + launch cost
    an eager op pays when the GPU keeps up."""
    import time
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| in fp64: the worst element, relative to the reference's scale (an
    elementwise ratio would blow up on values near zero)."""
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def row_rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Worst row's ||got - ref|| / ||ref|| in fp64 (rows: the first dim, the rest flattened): the per-token error
    the GPU cases and the container cases report."""
    g, r = got.double().flatten(1), ref.double().flatten(1)
    return ((g - r).norm(dim=1) / r.norm(dim=1).clamp_min(1e-30)).max().item()


def run_info() -> dict:
    """What every benchmark's JSON says about its run: the script (relative to the repo root), the exact command
    that ran it and the UTC date; benchmarks/results.py prints them beside the figures."""
    import datetime
    import shlex
    import sys
    root = Path(__file__).resolve().parents[1]
    script = Path(sys.argv[0]).resolve()
    rel = script.relative_to(root).as_posix() if script.is_relative_to(root) else sys.argv[0]
    return {"benchmark": rel, "command": shlex.join(["python3", rel, *sys.argv[1:]]),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def write_rows(path: str, rows: list, partial: bool = False, **extra) -> Path:
    """{"device", run_info(), **extra, "complete", "rows"} as JSON at `path` (parents created). partial=True: the rows
    so far, rewritten after each point of a long run, so a run cut short (a timeout, a lost GPU) keeps what it
    measured ("complete": false), and nothing is printed."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"device": torch.cuda.get_device_name(), **run_info(), **extra, "complete": not partial, "rows": rows}
    tmp = out.with_name(out.name + ".tmp")   # replaced whole, never left half-written
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(out)
    if not partial:
        print(f"wrote {out}")
    return out


def schedule_profile(schedule: str, arch: str):
    """The arch profile that runs `schedule` on a GPU of `arch`: its own, or the schedule emulated on that arch."""
    from dsv4_jit.arch import get_profile
    return get_profile(arch) if schedule == arch else get_profile(schedule).emulated(get_profile(arch))


def compile_job(job: tuple) -> str:
    """(kernel name, params, arch, schedule) -> compiled into the default store; for a ProcessPoolExecutor map
    (the store's per-key locks make parallel compiles safe). A schedule other than the arch is compiled emulated
    on it. A failure is only named: the caller's timed loop reports it again."""
    from dsv4_jit import jit
    from dsv4_jit.spec import Variant, get_spec
    name, params, arch, schedule = job
    v = Variant.make(name, params, schedule_profile(schedule, arch), schedule)
    try:
        jit.compile_variant(get_spec(name), v)
        return f"compiled {v.name}"
    except Exception as e:  # reported again (as skipped) by the timed loop
        return f"{v.name}: {type(e).__name__}"


def compile_variants(variants, arch: str, jobs: int) -> None:
    """Compile each distinct Variant into the default store with `jobs` processes (compile_job on a GPU of `arch`),
    printing one line each, before a benchmark times them."""
    from concurrent.futures import ProcessPoolExecutor
    distinct = {(v.kernel, v.params, v.schedule): v for v in variants}
    with ProcessPoolExecutor(jobs) as ex:
        for msg in ex.map(compile_job, [(v.kernel, dict(v.p), arch, v.schedule) for v in distinct.values()]):
            print(msg, flush=True)
