"""GPU-family profiles. Everything that differs between targets lives here and is
passed in explicitly, so every schedule can be compiled on a machine with no GPU."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterable

from .errors import UnsupportedArchError

# TileLang pass-config names (strings, so importing this module does not import TileLang).
DISABLE_WARP_SPECIALIZED = "tl.disable_warp_specialized"
DISABLE_TMA_LOWER = "tl.disable_tma_lower"
DISABLE_WGMMA = "tl.disable_wgmma"


@dataclass(frozen=True)
class ArchProfile:
    name: str                 # canonical target arch, e.g. "sm_120a"
    family: str               # schedule family: "hopper", "blackwell_dc", "blackwell_consumer"
    max_smem_per_block: int   # opt-in dynamic shared memory per block, bytes
    num_sms_hint: int         # used only by split heuristics; real counts vary per SKU
    has_wgmma: bool
    mma_path: str             # "wgmma" | "tcgen05" | "mma.sync"
    pass_configs: dict = field(default_factory=dict, hash=False, compare=False)
    description: str = field(default="", hash=False, compare=False)
    # Whose schedule this is: differs from `name` only when emulating (an SM120 schedule built
    # for sm_90a to prove it correct on a Hopper GPU).
    schedule_of: str = ""
    # The operand type an fp8 kernel's tensor-core code runs in. "float16" on Hopper: sm_90a has fp8 only in
    # WGMMA, and ptxas emulates mma.sync e4m3 (both operands unpacked to f16 before two HMMA m16n8k16 and fp32
    # adds, every mma, in the SASS); every e4m3 / e2m1 value is exact in f16, so converting once gives the same
    # products. SM12x runs fp8 mma.sync natively; sm_100a keeps fp8.
    fp8_mma_operand: str = "float8_e4m3"

    @property
    def schedule(self) -> str:
        return self.schedule_of or self.name

    @property
    def target(self) -> dict:
        return {"kind": "cuda", "arch": self.name}

    def emulated(self, on: "ArchProfile") -> "ArchProfile":
        """This profile's schedule compiled for another arch (proving an SM120 schedule on sm_90a).

        Same family, budget and pass configs as `self`, but targeting `on`'s ISA."""
        return ArchProfile(
            name=on.name, family=self.family, max_smem_per_block=self.max_smem_per_block,
            num_sms_hint=self.num_sms_hint, has_wgmma=False, mma_path="mma.sync",
            pass_configs=dict(self.pass_configs), description=f"{self.name} schedule on {on.name}",
            schedule_of=self.name, fp8_mma_operand=self.fp8_mma_operand,
        )


# Shared memory the driver reserves per CTA (1 KB on sm_80+): an SM has a block's opt-in maximum plus one reserve.
SMEM_RESERVED_PER_CTA = 1024


def ctas_by_smem(arch: ArchProfile, smem: int) -> int:
    """CTAs of `smem` bytes of shared memory each that one SM of `arch` holds, counting each CTA's reserve."""
    return (arch.max_smem_per_block + SMEM_RESERVED_PER_CTA) // (smem + SMEM_RESERVED_PER_CTA)


_SM12X_PASSES = {DISABLE_WARP_SPECIALIZED: True, DISABLE_TMA_LOWER: True, DISABLE_WGMMA: True}

PROFILES: dict[str, ArchProfile] = {
    "sm_90a": ArchProfile("sm_90a", "hopper", 232_448, 132, True, "wgmma",
                          {DISABLE_WARP_SPECIALIZED: True, DISABLE_TMA_LOWER: True},
                          "H100 / H200 / H20", fp8_mma_operand="float16"),
    "sm_100a": ArchProfile("sm_100a", "blackwell_dc", 232_448, 148, False, "tcgen05",
                           {DISABLE_WARP_SPECIALIZED: True, DISABLE_TMA_LOWER: True},
                           "B200 / GB200"),
    # SM12x: 101,376 B per block, mma.sync only; no warp specialization / setmaxnreg
    # (no SM120 here can prove that path, and the public SM120 kernels avoid it).
    "sm_120a": ArchProfile("sm_120a", "blackwell_consumer", 101_376, 188, False, "mma.sync",
                           dict(_SM12X_PASSES), "RTX PRO 6000 / RTX 50xx"),
    "sm_121a": ArchProfile("sm_121a", "blackwell_consumer", 101_376, 48, False, "mma.sync",
                           dict(_SM12X_PASSES), "DGX Spark (GB10)"),
}

# The canonical schedule of each GPU family: what a variant records when an emulated profile (an SM120
# schedule compiled for sm_90a to prove it on a Hopper GPU) selects it.
FAMILY_SCHEDULE = {"hopper": "sm_90a", "blackwell_dc": "sm_100a", "blackwell_consumer": "sm_120a"}


def schedule_name(arch: ArchProfile) -> str:
    """The schedule an (possibly emulated) profile stands for: an SM120 profile retargeted to sm_90a keeps its
    family, so its variants record schedule=sm_120a and get the SM12x pass configs."""
    canon = PROFILES.get(arch.name)
    if canon is not None and canon.family == arch.family:
        return arch.name
    return FAMILY_SCHEDULE[arch.family]


def check_arch(kernel: str, arch: object) -> ArchProfile:
    """`select`'s arch argument: an ArchProfile of a known family, else a ValueError naming the kernel."""
    if not isinstance(arch, ArchProfile):
        raise ValueError(f"{kernel}: arch must be an ArchProfile (dsv4_jit.arch.get_profile), got {arch!r}")
    if arch.family not in FAMILY_SCHEDULE:
        raise ValueError(f"{kernel}: no schedule for GPU family {arch.family!r}")
    return arch


_ALIASES = {
    "sm90": "sm_90a", "sm_90": "sm_90a", "90": "sm_90a", "90a": "sm_90a", "hopper": "sm_90a", "h100": "sm_90a", "h200": "sm_90a",
    "sm100": "sm_100a", "sm_100": "sm_100a", "100": "sm_100a", "100a": "sm_100a", "b200": "sm_100a",
    "sm120": "sm_120a", "sm_120": "sm_120a", "120": "sm_120a", "120a": "sm_120a",
    "sm121": "sm_121a", "sm_121": "sm_121a", "121": "sm_121a", "121a": "sm_121a",
}

DEFAULT_OFFLINE_ARCH = "sm_120a"


def get_profile(arch: str | ArchProfile) -> ArchProfile:
    if isinstance(arch, ArchProfile):
        return arch
    key = str(arch).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in PROFILES:
        raise UnsupportedArchError(
            f"unsupported arch {arch!r}; supported: {', '.join(PROFILES)} "
            f"(aliases such as sm_120, 120a, hopper are accepted)")
    return PROFILES[key]


def parse_arch_list(value: str | Iterable[str]) -> list[ArchProfile]:
    items = value.replace(",", " ").split() if isinstance(value, str) else list(value)
    out: list[ArchProfile] = []
    for item in items:
        p = get_profile(item)
        if p not in out:
            out.append(p)
    if not out:
        raise UnsupportedArchError(f"empty arch list; supported: {', '.join(PROFILES)}")
    return out


def arch_from_capability(major: int, minor: int) -> ArchProfile:
    name = {(9, 0): "sm_90a", (10, 0): "sm_100a", (12, 0): "sm_120a", (12, 1): "sm_121a"}.get((major, minor))
    if name is None:
        raise UnsupportedArchError(
            f"GPU compute capability {major}.{minor} is not supported; supported: {', '.join(PROFILES)}")
    return PROFILES[name]


def detect_arch(device: int | None = None) -> ArchProfile | None:
    """Current GPU's profile, or None when no CUDA GPU is visible."""
    try:
        import torch
        if not torch.cuda.is_available():
            return None
        idx = torch.cuda.current_device() if device is None else device
        major, minor = torch.cuda.get_device_capability(idx)
    except Exception:
        return None
    return arch_from_capability(major, minor)


def resolve_archs(explicit: str | Iterable[str] | None = None) -> tuple[list[ArchProfile], str]:
    """Archs to build for: `--arch`, else DSV4_JIT_ARCH, else the GPU, else sm_120a.

    Returns the profiles and a short reason (printed by the CLI so a default is never silent)."""
    if explicit:
        return parse_arch_list(explicit), "from --arch"
    env = os.environ.get("DSV4_JIT_ARCH")
    if env:
        return parse_arch_list(env), "from DSV4_JIT_ARCH"
    gpu = detect_arch()
    if gpu is not None:
        return [gpu], "detected GPU"
    return [PROFILES[DEFAULT_OFFLINE_ARCH]], f"no GPU and no --arch: defaulting to {DEFAULT_OFFLINE_ARCH}"
