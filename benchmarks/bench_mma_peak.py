"""The tensor-core ceiling every mma.sync kernel here runs under: mma.sync throughput with operands in registers
(no memory traffic), per operand type, on this GPU.

Every SM12x schedule (and every sm_90a one but fp8_gemm past 64 rows, which runs WGMMA) issues `mma.sync`, so the
ceiling a compute-bound kernel of this package can reach there is this figure, not the GPU's datasheet peak (on
Hopper that counts WGMMA; the torch._scaled_mm row below measures it for the WGMMA GEMM).
Benchmarks that report TFLOP/s (bench_gemm.py's large M, bench_moe.py's prefill, the indexer logits) read against
it. Each warp runs 8 independent accumulators (no dependent mma back to back) on register operands loaded once;
the A operand toggles between 1.0 and 2.0 every iteration (an XOR passed through an empty volatile asm), so the
compiler can neither hoist a product out of the loop nor see that it repeats. sm_90a emulates fp8 mma.sync (f16
HMMAs into a zero accumulator, then fp32 adds), and its fp8 row read 1,586 TFLOP/s with operands fixed in the loop
and 1,089 with a plain XOR (H100, 2026-11-24): both let ptxas reuse products. With the opaque toggle: fp8 450.5,
bf16 625.9, fp16 625.7 TFLOP/s (the f16 rows 656 before: the toggle costs them ~5%).

    python benchmarks/bench_mma_peak.py --out bench_out/mma_peak.json [--ctas-per-sm 4] [--warps 8]
    python benchmarks/bench_mma_peak.py --compile-only --arch sm_120a     (no GPU: check that it builds)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# label -> (the A/B operand type as tl::DataType names it, the mma's K, one 32-bit word of 1.0s in that type, the
# XOR that turns every 1.0 of a word into 2.0 and back)
SHAPES = {
    "fp8 e4m3 m16n8k32, fp32 acc": ("kFloat8_e4m3", 32, 0x38383838, 0x78787878),
    "bf16 m16n8k16, fp32 acc": ("kBFloat16", 16, 0x3F803F80, 0x7F807F80),
    "fp16 m16n8k16, fp32 acc": ("kFloat16", 16, 0x3C003C00, 0x7C007C00),
}
ACCS = 8   # independent n8 accumulators per warp
# identity the compiler cannot look through (no instruction): keeps the toggled A operand opaque every iteration
_OPAQUE_SRC = """
__device__ __forceinline__ unsigned dsv4_opaque(unsigned v) { asm volatile("" : "+r"(v)); return v; }
"""


def build(kind: str, k: int, iters: int, warps: int, toggle: int):
    import tilelang.language as T
    mma = (f"tl::mma_sync<tl::DataType::{kind}, tl::DataType::{kind}, tl::DataType::kFloat32, 16, 8, {k}, "
           "false, true>")
    blocks = T.dynamic("blocks")
    threads = 32 * warps

    @T.prim_func
    def mma_peak(x: T.Tensor[(32,), "int32"], out: T.Tensor[(blocks * threads,), "float32"]):
        with T.Kernel(blocks, threads=threads) as bx:
            T.import_source("#include <tl_templates/cuda/instruction/mma.h>\n" + _OPAQUE_SRC)
            a = T.alloc_local((4,), "uint32")
            b = T.alloc_local((2 * ACCS,), "uint32")
            c = T.alloc_local((4 * ACCS,), "float32")
            total = T.alloc_var("float32")
            tid = T.get_thread_binding()
            for v in T.unroll(4):
                a[v] = T.reinterpret(x[(tid + v) % 32], "uint32")
            for v in T.unroll(2 * ACCS):
                b[v] = T.reinterpret(x[(tid * 3 + v) % 32], "uint32")
            for v in T.unroll(4 * ACCS):
                c[v] = 0.0
            for _ in T.serial(iters):
                for v in T.unroll(4):   # 1.0 <-> 2.0: A differs every iteration, and ptxas cannot see it repeat
                    a[v] = T.call_extern("uint32", "dsv4_opaque", a[v] ^ T.Cast("uint32", toggle))
                for j in T.unroll(ACCS):
                    T.call_extern("handle", mma, T.address_of(c[j * 4]), T.address_of(a[0]), T.address_of(b[j * 2]))
            total = 0.0
            for v in T.unroll(4 * ACCS):
                total += c[v]
            out[bx * threads + tid] = total

    return mma_peak


def compile_kernel(kind: str, k: int, iters: int, warps: int, arch: str, toggle: int):
    import tilelang
    return tilelang.compile(build(kind, k, iters, warps, toggle), target={"kind": "cuda", "arch": arch},
                            pass_configs={"tl.disable_thread_storage_sync": True})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctas-per-sm", type=int, default=4)
    ap.add_argument("--warps", type=int, default=8)
    ap.add_argument("--iters", type=int, default=4096)
    ap.add_argument("--arch", default=None, help="compile target (default: this GPU's)")
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--out", default="bench_out/mma_peak.json")
    args = ap.parse_args()
    if args.iters % 2:
        ap.error("--iters must be even (A alternates 1.0 and 2.0)")
    if args.compile_only:
        for label, (kind, k, _, toggle) in SHAPES.items():
            src = compile_kernel(kind, k, args.iters, args.warps, args.arch or "sm_120a", toggle).get_kernel_source()
            assert "mma_sync" in src, label
            print(f"{label}: compiled for {args.arch or 'sm_120a'}")
        return

    import torch
    from dsv4_jit.arch import detect_arch
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks.* imports
    from benchmarks.harness import bench_us, run_info
    arch = args.arch or detect_arch().name
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    blocks = sms * args.ctas_per_sm
    threads = 32 * args.warps
    rows = []
    print(f"{torch.cuda.get_device_name()}; {arch}; {blocks} CTAs x {args.warps} warps, {args.iters} iterations of "
          f"{ACCS} independent mma a warp")
    for label, (kind, k, one, toggle) in SHAPES.items():
        kern = compile_kernel(kind, k, args.iters, args.warps, arch, toggle)
        x = torch.full((32,), one, dtype=torch.int32, device="cuda")   # every pattern is below 2^31
        out = torch.empty(blocks * threads, dtype=torch.float32, device="cuda")
        kern(x, out)
        torch.cuda.synchronize()
        # every C element sums k products of 2.0 and 1.0 in turn (iters mma), 4 per accumulator, ACCS accumulators
        want = float(k * (args.iters // 2) * 3 * 4 * ACCS)
        ok = bool(torch.all(out == want))
        us = bench_us(lambda: kern(x, out))
        flop = 2.0 * 16 * 8 * k * ACCS * args.iters * args.warps * blocks
        tflops = flop / (us * 1e-6) / 1e12
        rows.append({"mma": label, "us": us, "tflops": tflops, "result_checked": ok})
        print(f"{label:<32} {us:10.1f} us {tflops:8.1f} TFLOP/s   result {'ok' if ok else 'WRONG'}")
    # the datasheet side for comparison: torch's FP8 GEMM (cuBLAS; WGMMA on Hopper), 8192^3, per-tensor scales
    n = 8192
    xa = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    xb = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()
    one_s = torch.ones((), device="cuda")
    us = bench_us(lambda: torch._scaled_mm(xa, xb, scale_a=one_s, scale_b=one_s, out_dtype=torch.bfloat16))
    rows.append({"mma": "torch._scaled_mm fp8 8192^3 (cuBLAS)", "us": us, "tflops": 2.0 * n ** 3 / (us * 1e-6) / 1e12})
    print(f"{rows[-1]['mma']:<32} {us:10.1f} us {rows[-1]['tflops']:8.1f} TFLOP/s")
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps({"device": torch.cuda.get_device_name(), **run_info(), "arch": arch, "ctas": blocks,
                                    "warps": args.warps, "iters": args.iters, "rows": rows}, indent=1))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
