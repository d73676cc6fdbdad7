"""Run a family's GPU cases (or those whose name contains a filter) on this GPU with both schedules, and
print the worst per-token error per case. A quick check before the full `pytest -m gpu` pass.

  python scripts/smoke_family.py attention --model deepseek-v4-flash --case "ratio=4" --tokens 1 8
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("family")
    ap.add_argument("--model", default="deepseek-v4-flash")
    ap.add_argument("--case", default="", help="substring of the case name")
    ap.add_argument("--tokens", nargs="*", type=int, default=None, help="override the case's token counts")
    ap.add_argument("--schedules", nargs="+", default=["sm_90a", "sm_120a"],
                    help="sm_120a runs the SM120 schedule compiled for this GPU's sm_90a")
    args = ap.parse_args()

    import torch
    from dsv4_jit import jit
    from dsv4_jit.arch import get_profile
    from dsv4_jit.family import all_families
    from dsv4_jit.model_config import load_model_config

    fam = all_families()[args.family]
    m = load_model_config(args.model)
    hopper = get_profile("sm_90a")
    profs = [hopper if s == "sm_90a" else get_profile(s).emulated(hopper) for s in args.schedules]
    dev = torch.device("cuda")
    failed = 0
    for case in fam.gpu_cases(m):
        if args.case not in case.name:
            continue
        for prof in profs:
            worst: dict = {}
            t0 = time.perf_counter()
            for i, t in enumerate(args.tokens or case.tokens):
                g = torch.Generator().manual_seed(1000 + i)
                inp = case.make_inputs(t, dev, g)
                out = case.make_outputs(inp, prof)
                for o in out.values():
                    o.fill_(float("nan"))
                case.launch(inp, out, prof, lambda spec, st, n: jit.load(spec, spec.select(prof, st, n)))
                torch.cuda.synchronize()
                want = case.reference(inp, out)
                for name, got in out.items():
                    td = case.token_dims.get(name, 0)
                    gg = got.double().movedim(td, 0).reshape(got.shape[td], -1)
                    ww = want[name].double().movedim(td, 0).reshape(got.shape[td], -1)
                    err = ((gg - ww).norm(dim=1) / ww.norm(dim=1).clamp_min(1e-30))
                    e = float(err.max()) if not got.isnan().any() else float("nan")
                    if not e <= worst.get(name, (-1, 0))[0]:
                        worst[name] = (e, t)
            ok = all(e <= case.tolerance[n] for n, (e, _) in worst.items())
            failed += not ok
            print(json.dumps({"case": case.name, "schedule": prof.schedule, "ok": ok, "s": round(time.perf_counter() - t0, 1),
                              "worst": {k: [float(f"{e:.3e}"), t] for k, (e, t) in worst.items()}}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
