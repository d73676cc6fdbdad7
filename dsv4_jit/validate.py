"""Input checks for the public ops: a clear ValueError, never an illegal memory access."""
from __future__ import annotations

from typing import Sequence

import torch


def check_tensor(t, name: str, shape: Sequence[int | None], dtype: torch.dtype,
                 device: torch.device | None = None, *, contiguous: bool = True) -> None:
    """`shape` entries of None accept any size. Raises ValueError naming the argument."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise ValueError(f"{name}: expected dtype {dtype}, got {t.dtype}")
    if t.dim() != len(shape) or any(s is not None and s != d for s, d in zip(shape, t.shape)):
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{name}: expected shape {want}, got {list(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected device {device}, got {t.device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous (call .contiguous())")
    if t.device.type != "cuda":
        raise ValueError(f"{name}: must be a CUDA tensor, got device {t.device}")


def same_layout(t, shape: tuple, dtype: torch.dtype, device: torch.device) -> bool:
    """The hot-path check: True when `t` is a contiguous tensor of exactly this shape, dtype and
    device (a handful of attribute reads). On False, call check_tensor for the precise error."""
    try:
        return t.dtype is dtype and t.shape == shape and t.device == device and t.is_contiguous()
    except AttributeError:
        return False


def require(t, name: str, shape: tuple, dtype: torch.dtype, device: torch.device) -> None:
    """same_layout, else the ValueError that check_tensor words (never returns quietly on a mismatch)."""
    if not same_layout(t, shape, dtype, device):
        check_tensor(t, name, list(shape), dtype, device)
        raise ValueError(f"{name}: expected a contiguous {dtype} tensor of shape {list(shape)} on {device}")


def require_1d(t, name: str, dtype: torch.dtype, device: torch.device) -> None:
    """A contiguous 1-D tensor of any length (workspaces)."""
    try:
        ok = t.dtype is dtype and t.dim() == 1 and t.device == device and t.is_contiguous()
    except AttributeError:
        ok = False
    if not ok:
        check_tensor(t, name, [None], dtype, device)
