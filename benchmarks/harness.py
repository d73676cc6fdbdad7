"""What the GPU benchmarks share: the mHC benchmarks' V4 shapes and inputs, and for every family's benchmark
the copy bandwidth, the two timers, the error metric and the JSON writer.

Imported by the scripts beside it (run as `python benchmarks/<script>.py`, so this directory is on
sys.path). torch and triton are imported by the callers' GPU paths only.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

H, HC, M, MP = 4096, 4, 24, 32  # V4-Flash hidden, hc_mult, mix width, mix width padded to 16
EPS, ITERS, POST_MULT = 1e-6, 20, 2.0
MODELS = {"flash": 4096, "pro": 7168}  # hidden size per V4 model; hc, mix width and eps are shared


def bench_us(fn) -> float:
    """Median of triton's do_bench (warmup 25 ms, rep 200 ms; L2 flushed before each call), in us."""
    from triton.testing import do_bench
    return do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3


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


def pre_weights(g: torch.Generator | None = None, dev: str = "cuda", hidden: int = H):
    """(fn [M, HC*hidden], hc_scale [3], hc_base [M]) fp32, random."""
    fn = torch.randn(M, HC * hidden, device=dev, generator=g) * 1e-2
    scale = torch.rand(3, device=dev, generator=g) + 0.5
    base = torch.randn(M, device=dev, generator=g) * 0.1
    return fn, scale, base


def head_weights(g: torch.Generator | None = None, dev: str = "cuda", hidden: int = H):
    """(hc_head_fn [HC, HC*hidden], hc_head_scale [1], hc_head_base [HC]) fp32, random."""
    fn = torch.randn(HC, HC * hidden, device=dev, generator=g) * 1e-2
    scale = torch.rand(1, device=dev, generator=g) + 0.5
    base = torch.randn(HC, device=dev, generator=g) * 0.1
    return fn, scale, base


def activations(t: int, g: torch.Generator | None = None, dev: str = "cuda", hidden: int = H):
    """(residual [t, HC, hidden] bf16, x [t, hidden] bf16, post [t, HC], comb [t, HC, HC]) for t tokens, random."""
    residual = torch.randn(t, HC, hidden, device=dev, generator=g).to(torch.bfloat16)
    x = torch.randn(t, hidden, device=dev, generator=g).to(torch.bfloat16)
    post = torch.rand(t, HC, device=dev, generator=g) * 2
    comb = torch.rand(t, HC, HC, device=dev, generator=g)
    return residual, x, post, comb


def write_rows(path: str, rows: list, **extra) -> Path:
    """{"device", **extra, "rows"} as JSON at `path` (parents created)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), **extra, "rows": rows}, indent=1))
    print(f"wrote {out}")
    return out


def compile_job(job: tuple) -> str:
    """(kernel name, params, arch, schedule) -> compiled into the default store; for a ProcessPoolExecutor map
    (the store's per-key locks make parallel compiles safe). A schedule other than the arch is compiled emulated
    on it. A failure is only named: the caller's timed loop reports it again."""
    from dsv4_jit import jit
    from dsv4_jit.arch import get_profile
    from dsv4_jit.spec import Variant, get_spec
    name, params, arch, schedule = job
    prof = get_profile(arch) if schedule == arch else get_profile(schedule).emulated(get_profile(arch))
    v = Variant.make(name, params, prof, schedule)
    try:
        jit.compile_variant(get_spec(name), v)
        return f"compiled {v.name}"
    except Exception as e:  # reported again (as skipped) by the timed loop
        return f"{v.name}: {type(e).__name__}"
