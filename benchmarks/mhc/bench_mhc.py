"""mHC kernels on the GPU: dsv4-jit vs tile-kernels 2.1.0 vs vLLM 0.33 (no-DeepGEMM path) vs torch.

For V4-Flash (H=4096) and V4-Pro (H=7168) shapes (hc 4, fn [24, 4H] fp32, eps 1e-6, post_mult 2.0,
20 Sinkhorn iterations), times mhc_pre, mhc_post and hc_head of every contender two ways:
  do_bench : median of triton.testing.do_bench (warmup 25 ms, rep 200 ms, L2 flushed before each
             call); the public call, host overhead included, as an eager engine pays it.
  graph    : the same call captured 20x in one CUDA graph, replayed (kernel time, as a graph-capturing
             engine pays it). A peer that cannot be captured reads n/a and the reason is printed.
Before timing, each peer's outputs are checked against ours (max |peer - ours| / max |ours|), and ours
against the fp32 torch reference, so the table compares the same math.

Peers (a peer that cannot be loaded prints why; its columns read n/a):
  tk   : tile-kernels 2.1.0 (the GPU bundle: /work/shared/gpu/bundle.sh ... tile-kernels==2.1.0), PDL on.
         2.1.0 no longer ships the prenorm GEMM (its mHC ops take the split-K partials of DeepGEMM's
         tf32_hc_prenorm_gemm), so vLLM's TileLang split-K GEMV stands in for DeepGEMM, split as
         DeepGEMM's heuristic asks (clamped to what the GEMV takes); 'tkfuse' times its big fuse alone.
         pre = GEMM + mhc_pre_big_fuse_fwd; post = mhc_post_fwd; head = GEMM (4 outputs) +
         mhc_reduce_partials_and_rmsnorm_fwd + mhc_head_compute_mix_fwd + mhc_pre_apply_mix_fwd.
  vllm : vLLM 0.33's own mHC functions with DeepGEMM unavailable (benchmarks/peers/vllm_mhc.py; files from
         `bash scripts/fetch_peers.sh` into .peers/). The stock wheel vendors DeepGEMM with an SM120
         prenorm GEMM, so this is vLLM on SM12x only with VLLM_USE_DEEP_GEMM=0 (benchmarks/peers/vllm_mhc.py says more).
Bytes for %copy (ours, do_bench): pre = residual read + fn read + layer_input write; post = x read +
residual read + out write, against a measured device-to-device copy (256 MiB, read + write).

    python benchmarks/mhc/bench_mhc.py --out bench_out/mhc.json [--tokens 1 8 64 512 4096] [--models flash pro]
    python benchmarks/mhc/bench_mhc.py --cross-compile sm_90a     # no GPU: build both peers' kernels only
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.* imports
from benchmarks.harness import bench_us, copy_bandwidth_gbs, graph_us_or_reason, rel_err, write_rows  # noqa: E402
from benchmarks.mhc.inputs import EPS, HC, ITERS, MODELS, POST_MULT, activations, head_weights, pre_weights  # noqa: E402

TK_VERSION = "2.1.0"
OPS = ("pre", "post", "head")
PEERS = ("tk", "vllm")
ERR_WARN = 1e-2  # bf16 outputs differ by <= 1 ulp (2^-8 relative) where the math is the same



def import_reference() -> Any:
    """The torch references (dsv4_jit.kernels.mhc.reference; older trees: .mhc_reference), or None."""
    import importlib
    for name in ("dsv4_jit.kernels.mhc.reference", "dsv4_jit.kernels.mhc_reference"):
        try:
            return importlib.import_module(name)
        except ImportError:
            pass
    print("torch reference not found: torch columns and the 'ours vs ref' check read n/a")
    return None


def load_vllm(peers_dir: str | None) -> tuple[Any, str | None]:
    try:
        from benchmarks.peers import vllm_mhc as peer_vllm_mhc
        peer_vllm_mhc.load(peers_dir)
        return peer_vllm_mhc, None
    except Exception as e:  # benchmark dependency only: say why, the columns read n/a
        return None, f"{type(e).__name__}: {e}"


def load_tile_kernels(pdl: bool) -> tuple[Any, str | None]:
    try:
        import tile_kernels
        ver = getattr(tile_kernels, "__version__", "?")
        if not ver.startswith("2."):
            return None, (f"tile-kernels {ver} is installed, {TK_VERSION} wanted (rebuild .gpu/ with "
                          f"/work/shared/gpu/bundle.sh ... tile-kernels=={TK_VERSION})")
        tile_kernels.set_pdl(pdl)
        return tile_kernels, None
    except Exception as e:
        return None, f"{type(e).__name__}: {e}"


def deepgemm_splits(tokens: int, k: int, n_sms: int) -> int:
    """DeepGEMM tf32_hc_prenorm_gemm's split count as vLLM/SGLang pick it: compute_num_split(64, K, cdiv(T, 64))."""
    return max(1, min(n_sms // math.ceil(tokens / 64), math.ceil(k / 64) // 4))


class TileKernels21:
    """tile-kernels 2.1.0's forward mHC kernels composed as its ops expect, fed by a stand-in prenorm GEMM."""

    def __init__(self, vllm: Any, splits: str, n_sms: int) -> None:
        from tile_kernels import mhc
        self.mhc, self.vllm, self.splits_arg, self.n_sms = mhc, vllm, splits, n_sms
        self.gemm_name = "vLLM TileLang split-K GEMV" if vllm is not None else "torch fp32 matmul (vLLM files missing)"

    def splits(self, tokens: int, k: int) -> int:
        if self.vllm is None:
            return 1
        want = deepgemm_splits(tokens, k, self.n_sms) if self.splits_arg == "deepgemm" else int(self.splits_arg)
        return self.vllm.max_gemm_splits(k, want)

    def gemm(self, residual: torch.Tensor, fn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x . fn^T [S, T, N], sum x^2 [S, T]) over S K-splits; x = residual flattened to [T, hc*H]."""
        t, hc, hidden = residual.shape
        x = residual.view(t, hc * hidden)
        if self.vllm is not None:
            return self.vllm.prenorm_gemm(x, fn, hidden, hc, self.splits(t, hc * hidden))
        xf = x.float()
        return (xf @ fn.t()).unsqueeze(0), xf.square().sum(-1).unsqueeze(0)

    def fuse(self, partials: tuple[torch.Tensor, torch.Tensor], residual: torch.Tensor, scale: torch.Tensor,
             base: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        t, hc, hidden = residual.shape
        post = torch.empty(t, hc, dtype=torch.float32, device=residual.device)
        comb = torch.empty(t, hc * hc, dtype=torch.float32, device=residual.device)
        layer_input = torch.empty(t, hidden, dtype=torch.bfloat16, device=residual.device)
        mul, sq = partials
        self.mhc.mhc_pre_big_fuse_fwd(mul, sq, scale, base, residual, post, comb, layer_input,
                                      EPS, EPS, EPS, POST_MULT, ITERS, n_splits=mul.shape[0])
        return layer_input, post, comb.view(t, hc, hc)

    def pre(self, residual, fn, scale, base):
        return self.fuse(self.gemm(residual, fn), residual, scale, base)

    def post(self, x, residual, post, comb):
        t, hc, hidden = residual.shape
        return self.mhc.mhc_post_fwd(x.view(1, t, hidden), residual.view(1, t, hc, hidden),
                                     post.view(1, t, hc, 1), comb.view(1, t, hc, hc)).view(t, hc, hidden)

    def head(self, residual, fn, scale, base):
        t, hc, hidden = residual.shape
        mul, sq = self.gemm(residual, fn)
        s, dev, f32 = mul.shape[0], residual.device, torch.float32
        mixes = torch.empty(t, hc, dtype=f32, device=dev)
        self.mhc.mhc_reduce_partials_and_rmsnorm_fwd(
            mul.view(s, t, 1, hc), sq.view(s, t, 1), torch.empty(t, 1, hc, dtype=f32, device=dev),
            torch.empty(t, 1, dtype=f32, device=dev), mixes, hc * hidden, EPS, s)
        pre = torch.empty(t, hc, dtype=f32, device=dev)
        self.mhc.mhc_head_compute_mix_fwd(mixes, scale, base, pre, EPS)
        y = torch.empty(t, hidden, dtype=torch.bfloat16, device=dev)
        self.mhc.mhc_pre_apply_mix_fwd(residual, pre, y)
        return y


def contenders(tk: TileKernels21 | None, vllm: Any, arch: str | None) -> dict[str, dict[str, Callable[..., Any]]]:
    """name -> {op -> f(inputs) -> outputs}; pre returns (layer_input [T,H], post [T,hc], comb [T,hc,hc])."""
    import dsv4_jit
    kw = dict(rms_eps=EPS, hc_eps=EPS, sinkhorn_iters=ITERS, post_mult=POST_MULT)
    c: dict[str, dict[str, Callable[..., Any]]] = {"ours": {
        "pre": lambda i: dsv4_jit.mhc_pre(i["residual"], i["fn"], i["scale"], i["base"], arch=arch, **kw),
        "post": lambda i: dsv4_jit.mhc_post(i["x"], i["residual"], i["post"], i["comb"], arch=arch),
        "head": lambda i: dsv4_jit.hc_head(i["residual"], i["fn_h"], i["scale_h"], i["base_h"], rms_eps=EPS,
                                           hc_eps=EPS, arch=arch)}}
    if tk is not None:
        c["tk"] = {"pre": lambda i: tk.pre(i["residual"], i["fn"], i["scale"], i["base"]),
                   "post": lambda i: tk.post(i["x"], i["residual"], i["post"], i["comb"]),
                   "head": lambda i: tk.head(i["residual"], i["fn_h"], i["scale_h"], i["base_h"]),
                   "fuse": lambda i: tk.fuse(i["tk_partials"], i["residual"], i["scale"], i["base"])}
    if vllm is not None:
        c["vllm"] = {"pre": lambda i: vllm.pre(i["residual"], i["fn"], i["scale"], i["base"], EPS, EPS, ITERS,
                                               POST_MULT),
                     "post": lambda i: vllm.post(i["x"], i["residual"], i["post"], i["comb"]),
                     "head": lambda i: vllm.head(i["residual"], i["fn_h"], i["scale_h"], i["base_h"], EPS, EPS)}
    return c


def reference(ref: Any) -> dict[str, Callable[..., Any]]:
    """The fp32 torch references, same calling convention as the contenders."""
    f32 = torch.float32
    return {"pre": lambda i: ref.ref_mhc_pre(i["residual"], i["fn"], i["scale"], i["base"], EPS, EPS, ITERS,
                                             POST_MULT, dtype=f32),
            "post": lambda i: ref.ref_mhc_post(i["x"], i["residual"], i["post"], i["comb"], dtype=f32),
            "head": lambda i: ref.ref_hc_head(i["residual"], i["fn_h"], i["scale_h"], i["base_h"], EPS, EPS,
                                              dtype=f32)}


def outputs_err(a: Any, b: Any) -> float:
    """Worst rel_err over the outputs of one call (pre has three)."""
    a, b = (a, b) if isinstance(a, (tuple, list)) else ((a,), (b,))
    return max(rel_err(x.reshape(y.shape), y) for x, y in zip(a, b))


def bench_row(model: str, hidden: int, t: int, cs: dict, ref: Any, tk: TileKernels21 | None,
              g: torch.Generator, dev: str = "cuda") -> dict:
    fn, scale, base = pre_weights(g, dev, hidden)
    fn_h, scale_h, base_h = head_weights(g, dev, hidden)
    residual, x, post, comb = activations(t, g, dev, hidden)
    inputs = dict(residual=residual, x=x, post=post, comb=comb, fn=fn, scale=scale, base=base, fn_h=fn_h,
                  scale_h=scale_h, base_h=base_h)
    r: dict[str, Any] = {"model": model, "H": hidden, "T": t, "err": {}, "na": {}}
    if tk is not None:
        r["tk_splits"] = tk.splits(t, HC * hidden)
        try:
            inputs["tk_partials"] = tk.gemm(residual, fn)
        except Exception as e:
            r["na"]["tk_fuse"] = f"{type(e).__name__}: {e}"
    # one call each (compiles stay out of the timing) and the cross-check against ours
    outs: dict[str, dict[str, Any]] = {}
    for name, ops in cs.items():
        outs[name] = {}
        for op, f in ops.items():
            try:
                outs[name][op] = f(inputs)
                torch.cuda.synchronize()
            except Exception as e:
                r["na"][f"{name}_{op}"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
    refs = reference(ref) if ref is not None else {}
    for op in OPS:
        ours = outs.get("ours", {}).get(op)
        if ours is None:
            continue
        if op in refs:
            r["err"][f"ours_{op}_vs_ref"] = outputs_err(ours, refs[op](inputs))
        for peer in PEERS:
            if op in outs.get(peer, {}):
                r["err"][f"{peer}_{op}"] = outputs_err(outs[peer][op], ours)
    # timings: ours keeps its old keys (pre_us, pre_graph_us, ...), peers are prefixed
    for name, ops in cs.items():
        for op, f in ops.items():
            if op not in outs[name]:
                continue
            key = op if name == "ours" else f"{name}_{op}"
            call = (lambda f=f: f(inputs))
            r[f"{key}_us"] = bench_us(call)
            us, why = graph_us_or_reason(call)
            if us is None:
                r["na"][f"{name}_{op}_graph"] = why
            else:
                r[f"{key}_graph_us"] = us
    for op, f in refs.items():
        r[f"torch_{op}_us"] = bench_us(lambda f=f: f(inputs))
    pre_bytes = residual.numel() * 2 + fn.numel() * 4 + t * hidden * 2
    post_bytes = x.numel() * 2 + residual.numel() * 2 * 2
    for k, nbytes in (("pre", pre_bytes), ("post", post_bytes)):
        if f"{k}_us" in r:
            r[f"{k}_gbs"] = nbytes / (r[f"{k}_us"] * 1e-6) / 1e9
    return r


def print_tables(rows: list[dict], model: str, hidden: int, bw: float, has_tk: bool) -> None:
    rows = [r for r in rows if r["model"] == model]
    if not rows:
        return
    cell = lambda r, k, w=7: f"{r[k]:{w}.1f}" if k in r else f"{'n/a':>{w}}"
    ecell = lambda r, k, w=8: f"{r['err'][k]:{w}.1e}" if k in r["err"] else f"{'n/a':>{w}}"
    print(f"\nV4-{model} (H={hidden}, hc={HC}); times in us (median); do_bench = L2 flushed, host overhead "
          f"included; graph = 20 calls in one CUDA graph")
    for op in OPS:
        extra = op == "pre" and has_tk  # the tile-kernels big fuse alone
        hdr = (f"{op:>5} | {'ours':>7} {'tk2.1':>7} {'vllm':>7} {'torch':>7}"
               + (f" {'%copy':>6}" if op != "head" else "") + (f" {'tkfuse':>7}" if extra else "")
               + f" | graph: {'ours':>7} {'tk2.1':>7} {'vllm':>7}" + (f" {'tkfuse':>7}" if extra else ""))
        print(hdr)
        print("-" * len(hdr))
        for r in rows:
            line = (f"{r['T']:>5} | {cell(r, f'{op}_us')} {cell(r, f'tk_{op}_us')} {cell(r, f'vllm_{op}_us')} "
                    f"{cell(r, f'torch_{op}_us')}")
            if op != "head":
                line += f" {100 * r[f'{op}_gbs'] / bw:5.1f}%" if f"{op}_gbs" in r else f" {'n/a':>6}"
            if extra:
                line += f" {cell(r, 'tk_fuse_us')}"
            line += f" |        {cell(r, f'{op}_graph_us')} {cell(r, f'tk_{op}_graph_us')} {cell(r, f'vllm_{op}_graph_us')}"
            if extra:
                line += f" {cell(r, 'tk_fuse_graph_us')}"
            print(line)
    print(f"\ncorrectness, V4-{model}: max |a - b| / max |b|; ours vs the fp32 torch reference, each peer vs ours")
    hdr = f"{'T':>5} | " + " | ".join(f"{op:>4}: {'ours':>8} {'tk2.1':>8} {'vllm':>8}" for op in OPS)
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['T']:>5} | " + " | ".join(
            f"      {ecell(r, f'ours_{op}_vs_ref')} {ecell(r, f'tk_{op}')} {ecell(r, f'vllm_{op}')}" for op in OPS))
    if "tk_splits" in rows[0]:
        print("tk2.1 GEMM splits: " + ", ".join(f"T={r['T']}: {r['tk_splits']}" for r in rows))
    bad = [(r["T"], k, v) for r in rows for k, v in r["err"].items() if v > ERR_WARN]
    for t, k, v in bad:
        print(f"WARNING: T={t} {k}: {v:.2e} > {ERR_WARN:g}, not the same math")
    seen: dict[str, list[int]] = {}
    for r in rows:
        for k, why in r["na"].items():
            seen.setdefault(f"{k}: {why}", []).append(r["T"])
    for what, ts in seen.items():
        print(f"n/a at T={','.join(map(str, ts))}: {what}")


XC_SMS = 132  # H100/H200 SM count: the tile-kernels GEMM splits a cross-compile builds for


def cross_compile(arch: str, tokens: list[int], models: list[str], peers_dir: str | None) -> int:
    """No GPU: compile every kernel the two peers launch in this benchmark for `arch` (no launch)."""
    status = 0
    try:
        from benchmarks.peers import vllm_mhc as peer_vllm_mhc
        for m in models:
            k = HC * MODELS[m]
            splits = sorted({peer_vllm_mhc.max_gemm_splits(k, deepgemm_splits(t, k, XC_SMS)) for t in tokens} - {1})
            n = peer_vllm_mhc.cross_compile(arch, MODELS[m], tokens, splits, HC, EPS, ITERS, POST_MULT,
                                            peers_dir=peers_dir)
            print(f"vllm {peer_vllm_mhc.VERSION}: {n} kernels built for {arch}, V4-{m}")
    except Exception as e:
        print(f"vllm: cross-compile failed: {type(e).__name__}: {e}")
        status = 1
    try:
        n = cross_compile_tk(arch, tokens, models)
        print(f"tile-kernels {TK_VERSION}: {n} kernels built for {arch}")
    except Exception as e:
        print(f"tile-kernels: cross-compile failed: {type(e).__name__}: {e}")
        status = 1
    return status


def cross_compile_tk(arch: str, tokens: list[int], models: list[str]) -> int:
    """tile-kernels 2.1.0's forward kernels as TileKernels21 launches them (PDL on), on meta tensors."""
    import tile_kernels
    from tile_kernels.mhc import head_compute_mix_cuda, norm_fn_cuda, post_cuda, pre_apply_mix_cuda, pre_big_fuse_cuda
    ver = getattr(tile_kernels, "__version__", "?")
    if not ver.startswith("2."):
        raise RuntimeError(f"tile-kernels {ver} found, {TK_VERSION} wanted")
    f32, bf = torch.float32, torch.bfloat16
    e = lambda *s, d=f32: torch.empty(*s, dtype=d, device="meta")
    n, t, m = 0, 64, HC * (2 + HC)
    for model in models:
        hidden = MODELS[model]
        k = HC * hidden
        try:
            from benchmarks.peers import vllm_mhc as peer_vllm_mhc
            splits = {peer_vllm_mhc.max_gemm_splits(k, deepgemm_splits(tt, k, XC_SMS)) for tt in tokens}
        except Exception:
            splits = {1}
        h_blk = math.gcd(hidden, 1024)
        jobs = [(pre_big_fuse_cuda.mhc_pre_big_fuse_fwd_cuda,
                 (e(s, t, m), e(s, t), e(3), e(m), e(t, HC, hidden, d=bf), e(t, HC), e(t, HC * HC), e(t, hidden, d=bf),
                  EPS, EPS, EPS, POST_MULT, ITERS, math.gcd(512, hidden)), dict(n_splits=s, use_pdl=True))
                for s in sorted(splits)]
        jobs += [(post_cuda.mhc_post_fwd_cuda, (e(t, HC, HC), e(t, HC, hidden, d=bf), e(t, HC), e(t, hidden, d=bf),
                                                e(t, HC, hidden, d=bf)),
                  dict(vec=math.gcd(8, h_blk // 128), n_thr=128, h_blk=h_blk, use_pdl=True))]
        jobs += [(norm_fn_cuda.mhc_reduce_partials_and_rmsnorm_fwd_cuda,
                  (e(s, t, 1, HC), e(s, t, 1), e(t, 1, HC), e(t, 1), e(t, HC), k, EPS, s), dict(use_pdl=True))
                 for s in sorted(splits)]
        jobs += [(head_compute_mix_cuda.mhc_head_compute_mix_fwd_cuda, (e(t, HC), e(1), e(HC), e(t, HC), EPS),
                  dict(token_block_size=32, use_pdl=True)),
                 (pre_apply_mix_cuda.mhc_pre_apply_mix_fwd_cuda, (e(t, HC, hidden, d=bf), e(t, HC), e(t, hidden, d=bf)),
                  dict(n_thr=64, h_blk=math.gcd(1024, hidden), use_pdl=True))]
        for impl, args, kw in jobs:
            impl.target = {"kind": "cuda", "arch": arch}
            t0 = time.time()
            impl.compile(*args, **kw)
            print(f"  tk {arch} {time.time() - t0:5.1f}s {getattr(impl.func, '__name__', impl)} H={hidden} {kw}")
            n += 1
    return n


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 512, 4096])
    ap.add_argument("--models", nargs="+", default=["flash", "pro"], choices=sorted(MODELS))
    ap.add_argument("--out", default="bench_out/mhc.json")
    ap.add_argument("--arch", default=None, help="our schedule to time (default: the GPU's)")
    ap.add_argument("--tk-splits", default="deepgemm",
                    help="K-splits of tile-kernels' GEMM: 'deepgemm' (its heuristic, clamped) or a number")
    ap.add_argument("--tk-pdl", type=int, default=1, choices=(0, 1), help="tile_kernels.set_pdl (default on)")
    ap.add_argument("--peers-dir", default=None, help="vLLM files (default: <repo>/.peers/vllm-0.33.0)")
    ap.add_argument("--cross-compile", metavar="ARCH", default=None,
                    help="no GPU needed: only build the peers' kernels for ARCH (e.g. sm_90a) and exit")
    args = ap.parse_args()
    if args.cross_compile:
        return cross_compile(args.cross_compile, args.tokens, args.models, args.peers_dir)
    if not torch.cuda.is_available():
        print("no GPU: nothing to benchmark (--cross-compile ARCH builds the peers' kernels)")
        return 0
    ref = import_reference()
    # peers first: tile-kernels' import takes seconds and leaves the GPU idle (clocks down), which
    # skewed the first timed row when the copy bandwidth was measured before it
    vllm, why_vllm = load_vllm(args.peers_dir)
    tk_mod, why_tk = load_tile_kernels(bool(args.tk_pdl))
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    tk = TileKernels21(vllm, args.tk_splits, n_sms) if tk_mod is not None else None
    peers = {"tk": (f"tile-kernels {tk_mod.__version__}, PDL {'on' if args.tk_pdl else 'off'}, prenorm GEMM: "
                    f"{tk.gemm_name}") if tk else f"n/a ({why_tk})",
             "vllm": (f"vLLM {vllm.VERSION} no-DeepGEMM TileLang path, files from "
                      f"{args.peers_dir or vllm.PEERS_DIR}") if vllm else f"n/a ({why_vllm})"}
    for name, what in peers.items():
        print(f"peer {name:<4}: {what}")
    cs = contenders(tk, vllm, args.arch)
    bw = copy_bandwidth_gbs()
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for model in args.models:
        for t in args.tokens:
            rows.append(bench_row(model, MODELS[model], t, cs, ref, tk, g))
            print(f"done V4-{model} T={t}", flush=True)
    print(f"\n{torch.cuda.get_device_name()}; copy bandwidth {bw:,.0f} GB/s")
    for model in args.models:
        print_tables(rows, model, MODELS[model], bw, tk is not None)
    print("\n%copy: ours, do_bench figure vs copy bandwidth; tkfuse: tile-kernels' big fuse alone (its GEMM is "
          "DeepGEMM's, absent here)")
    write_rows(args.out, rows, copy_gbs=bw, peers=peers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
