"""What the moe family's KernelSpecs share: their pass configs. Kernel-defining (the artifact key of each moe
kernel hashes this module too)."""
from typing import Any

from dsv4_jit.arch import get_profile
from dsv4_jit.spec import KernelSpec, Variant


class MoeKernelSpec(KernelSpec):
    # True: mma.sync on every arch, as fp8_gemm (the WGMMA variants of our kernels gave wrong results on H100)
    mma_sync_only = False

    def pass_configs(self, variant: Variant) -> dict[str, Any]:
        cfg = dict(get_profile(variant.schedule).pass_configs)
        cfg["tl.disable_vectorize_256"] = True   # 16-byte vectors only: the SM12x schedule proven on sm_90a
        if self.mma_sync_only:
            cfg["tl.disable_wgmma"] = True
        return cfg
