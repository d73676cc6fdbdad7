"""One indexer top-k variant launched a few times on bench_indexer's decode logits, eagerly, for a profiler to
attach to (ncu), e.g.

  ncu --clock-control none -k regex:indexer_topk --launch-skip 1 --launch-count 1 --section WarpStateStats \
      --section SourceCounters python benchmarks/indexer/profile_topk.py --ctx 65536 --batch 1 \
      --kernel indexer_topk --params '{"threads": 1024, "resident": 27648}'

--params overrides what select picks (sweep_topk.py's candidates). Prints the op's time from CUDA events so a run
without a profiler says something too.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks.* imports
from benchmarks.indexer.bench_indexer import PAGE, RATIO, TOPK, make_inputs  # noqa: E402
from benchmarks.harness import events_us  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--schedule", default=None, help="sm_120a: the SM120 schedule compiled for this GPU")
    ap.add_argument("--ctx", type=int, default=65536)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--kernel", default="indexer_topk", choices=["indexer_topk", "indexer_topk_split"])
    ap.add_argument("--params", default="{}", help="JSON overrides of the selected variant's params")
    ap.add_argument("--launches", type=int, default=3)
    args = ap.parse_args()

    import dsv4_jit
    from dsv4_jit import jit
    from dsv4_jit.arch import detect_arch, get_profile, schedule_name
    from dsv4_jit.kernels.indexer import topk as tk
    from dsv4_jit.spec import Variant, get_spec
    native = detect_arch()
    arch = native if args.schedule in (None, native.name) else get_profile(args.schedule).emulated(native)
    b, width = args.batch, args.ctx // RATIO + 64
    d = make_inputs(b, args.ctx, width, torch.Generator(device="cuda").manual_seed(0))
    lg = torch.empty(b, width, dtype=torch.float32, device="cuda")
    info = torch.empty(b, 3, dtype=torch.int32, device="cuda")
    dsv4_jit.indexer_decode_logits(d["q"], d["q_scale"], d["weights"], d["kv_cache"], d["seq_lens"],
                                   d["block_table"], next_n=1, arch=arch, out=lg, row_info=info)
    spec = get_spec(args.kernel)
    p = {**spec.select(arch, {"topk": TOPK, "page_size": PAGE}, b).p, **json.loads(args.params)}
    kern = jit.load(spec, Variant.make(args.kernel, p, arch, schedule_name(arch)))
    idx = torch.empty(b, TOPK, dtype=torch.int32, device="cuda")
    lens = torch.empty(b, dtype=torch.int32, device="cuda")
    if args.kernel == "indexer_topk":
        def fn():
            kern(lg, info, d["block_table"], idx, lens)
    else:
        ws = torch.zeros(b, tk.ROW_WS, dtype=torch.int32, device="cuda")   # every launch leaves it zeroed

        def fn():
            kern(lg, info, d["block_table"], ws, idx, lens)
    print(f"{args.kernel} {p} ctx={args.ctx} B={b}: {events_us(fn, args.launches):.1f} us per call "
          f"(events, L2 warm)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
