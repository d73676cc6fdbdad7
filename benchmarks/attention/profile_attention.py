"""One sparse MLA decode point launched a few times, eagerly, for a profiler to attach to (ncu), e.g.

  ncu --clock-control none -k regex:sparse_mla_fwd --launch-skip 1 --launch-count 1 --section SpeedOfLight \
      --section WarpStateStats python benchmarks/attention/profile_attention.py --schedule sm_120a --heads 64 --batch 64

Same inputs as bench_attention.py (make_point); --schedule sm_120a runs the SM120 schedule compiled for
this sm_90a GPU. Prints the op's time from CUDA events (L2 not flushed) so a run without a profiler says
something too.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.* imports
from benchmarks.attention.bench_attention import make_fns, make_point  # noqa: E402
from benchmarks.harness import events_us  # noqa: E402

from dsv4_jit.arch import get_profile  # noqa: E402
from dsv4_jit.kernels.attention.sparse_mla import D  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--schedule", default="sm_90a", choices=["sm_90a", "sm_120a"])
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=65536)
    ap.add_argument("--ratio", type=int, default=4)
    ap.add_argument("--launches", type=int, default=3)
    args = ap.parse_args()
    hopper = get_profile("sm_90a")
    prof = hopper if args.schedule == "sm_90a" else get_profile("sm_120a").emulated(hopper)
    g = torch.Generator(device="cuda").manual_seed(0)
    p = make_point(args.batch, args.heads, args.ctx, args.ratio, g)
    f, _ = make_fns(p, args.heads, args.batch, {"ours": prof}, None, D ** -0.5)["ours"]
    print(f"{args.schedule} H={args.heads} B={args.batch} ratio={args.ratio} ctx={args.ctx}: "
          f"{events_us(f, args.launches):.1f} us per call (events, L2 warm)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
