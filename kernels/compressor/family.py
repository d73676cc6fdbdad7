"""The KV compressor family (compress.py): the per-token state write and the window compression into the
compressed KV cache (fp8_ds_mla, the attention's) and the indexer's index-K cache. Host ops: ops.py.
References: reference.py.

Call sites per forward pass (from the model config's compress ratios; assumptions stated):
  * every ratio-4 layer runs two compressors: the attention KV (head_dim 512, overlapping windows of 4) and the
    indexer keys (index_head_dim 128, overlapping windows of 4);
  * every ratio-128 layer runs one: the attention KV (head_dim 512, windows of 128);
  * each runs compressor_state_write on every token, then compressor_compress (entries for the tokens that
    complete a window), after the fused wkv/wgate GEMM (fp32 out, left to the engine) and before attention.
"""
from __future__ import annotations

from dsv4_jit.family import GpuCase, KernelFamily, KernelUse, register_family
from dsv4_jit.spec import get_spec
from dsv4_jit.testing import cuda_generator

from . import compress  # noqa: F401  (registers the specs)

STATE_PAGE, CACHE_BLOCK, BATCH = 16, 64, 4
# the kernel's entries against the reference's own e4m3 rounding of the float64 values: exact but for an
# e4m3 step where fp32 rsqrt / fma ordering moves a value across a rounding boundary (each such element costs
# ~1/16 of itself; the e4m3 rounding itself is ~3% per entry and would hide a wrong scale group)
FP8_TOL = 2e-2
GPU_TOKENS = (1, 7, 64, 300)


def compressor_sites(model) -> list[tuple[int, int, str]]:
    """(ratio, head_dim, label) of every compressor a forward pass runs, one per distinct shape."""
    ratios = set(model.layer_ratios)
    sites = []
    if 4 in ratios:
        sites.append((4, int(model.head_dim), "ratio-4 layers: attention KV (overlapping windows of 4)"))
        sites.append((4, int(model.index_head_dim), "ratio-4 layers: indexer keys (overlapping windows of 4)"))
    if 128 in ratios:
        sites.append((128, int(model.head_dim), "ratio-128 layers: attention KV (windows of 128)"))
    return sites


def _uses(model, parallel) -> list[KernelUse]:
    from .ops import compress_static, state_static
    eps = float(model.rms_norm_eps)
    uses = []
    for ratio, d, label in compressor_sites(model):
        uses.append(KernelUse(get_spec("compressor_state_write"), state_static(ratio, d), f"state rows, {label}"))
        uses.append(KernelUse(get_spec("compressor_compress"), compress_static(ratio, d, eps), f"compress, {label}"))
    return uses


def _compress_case(m, ratio: int, d: int) -> GpuCase:
    import torch
    from . import ops, reference
    eps = float(m.rms_norm_eps)
    coff = reference.coff_of(ratio)
    c = coff * d

    def make_inputs(t, device, g):
        cg = cuda_generator(g, device)
        max_pos = 8 * ratio * 4
        pages_per = max_pos // STATE_PAGE
        total = BATCH * pages_per + 3
        perm = torch.randperm(total, generator=cg, device=device).int()
        sbt = perm[: BATCH * pages_per].view(BATCH, pages_per).contiguous()
        rows = total * STATE_PAGE
        state = torch.cat([torch.randn(rows, c, generator=cg, device=device),
                           torch.randn(rows, c, generator=cg, device=device) * 2], 1)
        req = torch.randint(0, BATCH, (t,), generator=cg, device=device).int()
        # about 2 of 3 tokens complete a window (their position is r*i + r - 1), the rest do not
        win = torch.randint(0, max_pos // ratio, (t,), generator=cg, device=device)
        emit = torch.rand(t, generator=cg, device=device) < 0.67
        emit[0] = True                          # T = 1 emits
        pos = torch.where(emit, win * ratio + ratio - 1, win * ratio + (win % (ratio - 1))).int()
        n_slots = 2 * t + CACHE_BLOCK
        pages = -(-n_slots // CACHE_BLOCK)
        slots = torch.randperm(pages * CACHE_BLOCK, generator=cg, device=device)[:t].int()
        slots[2::5] = -1                        # every fifth token has no output slot
        ang = torch.rand(max_pos, 32, generator=cg, device=device) * 6.3
        cos_sin = torch.cat([ang.cos(), ang.sin()], 1).contiguous()
        w = (torch.rand(d, generator=cg, device=device) + 0.5).to(torch.bfloat16)
        pb = (CACHE_BLOCK * 584 + 575) // 576 * 576 if d == 512 else CACHE_BLOCK * (d + 4)
        fill = torch.randint(0, 256, (pages, pb), dtype=torch.uint8, generator=cg, device=device)
        return {"state": state, "sbt": sbt, "pos": pos, "req": req, "slots": slots, "cos_sin": cos_sin, "w": w,
                "fill": fill, "t": t}

    def make_outputs(inp, arch):
        return {"entry": torch.empty(inp["t"], d, dtype=torch.float64, device=inp["pos"].device)}

    def read_entries(cache, slots, emitting):
        if d == 512:
            from dsv4_jit.kernels.attention.reference import unpack_fp8_ds_mla
            allrows = unpack_fp8_ds_mla(cache, CACHE_BLOCK).double()
        else:
            from dsv4_jit.kernels.indexer.reference import unpack_paged_cache
            allrows, _ = unpack_paged_cache(cache, d)
        got = allrows[slots.clamp_min(0).long()]
        return torch.where(emitting[:, None], got, torch.zeros_like(got))

    def emitting_of(inp):
        return ((inp["pos"] + 1) % ratio == 0) & (inp["slots"] >= 0)

    def launch(inp, out, arch, get_kernel):
        cache = inp["fill"].clone()
        ops.compressor_compress(inp["state"], inp["sbt"], inp["pos"], inp["req"], inp["slots"], inp["w"],
                                inp["cos_sin"], cache, ratio=ratio, state_page=STATE_PAGE, block_size=CACHE_BLOCK,
                                eps=eps, arch=arch, get_kernel=get_kernel)
        inp["_cache"] = cache
        out["entry"].copy_(read_entries(cache, inp["slots"], emitting_of(inp)))

    def ref(inp, out):
        cache, fill = inp["_cache"].cpu(), inp["fill"].cpu()
        emitting = emitting_of(inp).cpu()
        # nothing but the emitting tokens' slots may change (entry bytes and their scales)
        touched = torch.zeros(cache.shape[0] * CACHE_BLOCK, dtype=torch.bool)
        touched[inp["slots"].cpu()[emitting].long()] = True
        tok = cache.shape[1] // CACHE_BLOCK if d != 512 else 576
        for s in range(touched.numel()):
            if touched[s]:
                continue
            pg, off = divmod(s, CACHE_BLOCK)
            if d == 512:
                spans = [(off * 576, off * 576 + 576), (CACHE_BLOCK * 576 + off * 8, CACHE_BLOCK * 576 + off * 8 + 8)]
            else:
                spans = [(off * d, off * d + d), (CACHE_BLOCK * d + off * 4, CACHE_BLOCK * d + off * 4 + 4)]
            for a, b in spans:
                if not torch.equal(cache[pg, a:b], fill[pg, a:b]):
                    raise AssertionError(f"compressor_compress wrote slot {s}, which no emitting token targets")
        del tok
        entries = reference.ref_compress(inp["state"].cpu(), inp["sbt"].cpu(), STATE_PAGE, inp["pos"].cpu(),
                                         inp["req"].cpu(), inp["slots"].cpu(), inp["w"].cpu(), inp["cos_sin"].cpu(),
                                         ratio=ratio, eps=eps)
        want = torch.zeros(inp["t"], d, dtype=torch.float64)
        for t in range(inp["t"]):
            s = int(inp["slots"][t])
            if s in entries:
                y, r, _ = entries[s]
                want[t] = reference.dequant_entry(y, r)   # the reference's own e4m3 rounding of the entry
        return {"entry": want.to(inp["pos"].device)}

    name = f"compressor_compress[ratio={ratio}, head_dim={d}]"
    return GpuCase(name, make_inputs, make_outputs, launch, ref, {"entry": FP8_TOL}, tokens=GPU_TOKENS,
                   fixes={"ratio": ratio, "head_dim": d})


def _state_case(m, ratio: int, d: int) -> GpuCase:
    import torch
    from . import ops, reference
    c = reference.coff_of(ratio) * d

    def make_inputs(t, device, g):
        cg = cuda_generator(g, device)
        return {"kv_score": torch.randn(t, 2 * c, generator=cg, device=device),
                "ape": torch.randn(ratio, c, generator=cg, device=device),
                "pos": torch.randint(0, 1 << 20, (t,), generator=cg, device=device).int(),
                "slots": torch.randperm(t, generator=cg, device=device).int(), "t": t}

    def make_outputs(inp, arch):
        return {"state": torch.empty(inp["t"], 2 * c, dtype=torch.float64, device=inp["pos"].device)}

    def launch(inp, out, arch, get_kernel):
        state = torch.full((inp["t"], 2 * c), float("nan"), device=inp["pos"].device)
        ops.compressor_state_write(inp["kv_score"], inp["ape"], inp["pos"], inp["slots"], state, ratio=ratio,
                                   arch=arch, get_kernel=get_kernel)
        out["state"].copy_(state.double())

    def ref(inp, out):
        rows = reference.state_rows(inp["kv_score"][:, :c], inp["kv_score"][:, c:], inp["ape"], inp["pos"], ratio)
        want = torch.empty_like(rows)
        want[inp["slots"].long()] = rows
        return {"state": want.double()}

    return GpuCase(f"compressor_state_write[ratio={ratio}, head_dim={d}]", make_inputs, make_outputs, launch, ref,
                   {"state": 1e-6}, tokens=GPU_TOKENS, fixes={"ratio": ratio, "head_dim": d})


def _gpu_cases(m) -> list[GpuCase]:
    cases = []
    for ratio, d, _ in compressor_sites(m):
        cases += [_state_case(m, ratio, d), _compress_case(m, ratio, d)]
    return cases


FAMILY = register_family(KernelFamily(
    name="compressor",
    specs=(get_spec("compressor_state_write"), get_spec("compressor_compress")),
    uses=_uses,
    gpu_cases=_gpu_cases,
    ops={"compressor_state_write": ("compressor_state_write",), "compressor_compress": ("compressor_compress",)},
    doc="V4 KV compressor: per-token state rows, gated window pooling + RMSNorm + RoPE + fp8 into the compressed caches",
))

__all__ = ["FAMILY", "compressor_sites"]
