"""Routed experts (MoE): the MXFP4 grouped expert GEMM and the routed-row layout. Kernel: fp4_moe_gemm.py.
Host ops: ops.py. Reference: reference.py. Registration: family.py."""
from .family import FAMILY  # noqa: F401
