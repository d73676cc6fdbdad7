"""Argument checks: a clear ValueError naming the argument, never an illegal memory access.

The tensor checks serve the public ops; `int_param` / `int_arg` serve a spec's `select` (its static params)
and the ops' plain int arguments. Validation only, so it lives outside the kernel modules the artifact key
hashes; torch is imported where a tensor is checked, so `select` runs without it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Collection, Mapping, Sequence

if TYPE_CHECKING:
    import torch


def _int_wanted(lo: int, hi: int | None, multiple: int) -> str:
    if hi is not None:
        return f"an int in [{lo}, {hi}]" + (f" and a multiple of {multiple}" if multiple > 1 else "")
    if multiple > 1:
        return f"a positive multiple of {multiple}" if lo <= multiple else f"a multiple of {multiple} >= {lo}"
    return f"an int >= {lo}"


def _checked_int(prefix: str, key: str, v: Any, lo: int, hi: int | None, multiple: int,
                 allowed: Collection[int] | None) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi) or v % multiple:
        raise ValueError(f"{prefix}{key} must be {_int_wanted(lo, hi, multiple)}, got {v!r}")
    if allowed is not None and v not in allowed:
        raise ValueError(f"{prefix}{key}={v} is not supported (supported: {sorted(allowed)})")
    return v


def int_param(kernel: str, static: Mapping[str, Any], key: str, *, lo: int = 1, hi: int | None = None,
              multiple: int = 1, allowed: Collection[int] | None = None) -> int:
    """static[key] as an int in [lo, hi], a multiple of `multiple` and one of `allowed` (each optional), else a
    ValueError naming the kernel and the key. For a spec's `select`."""
    if not isinstance(static, Mapping) or key not in static:
        raise ValueError(f"{kernel}: static params lack {key!r}")
    return _checked_int(f"{kernel}: ", key, static[key], lo, hi, multiple, allowed)


def int_arg(name: str, v: Any, *, op: str = "", lo: int = 1, hi: int | None = None, multiple: int = 1,
            allowed: Collection[int] | None = None) -> int:
    """A host op's int argument, checked as `int_param` checks a static; the ValueError names the argument
    (after the op, when given)."""
    return _checked_int(f"{op}: " if op else "", name, v, lo, hi, multiple, allowed)


def check_tensor(t, name: str, shape: Sequence[int | None], dtype: torch.dtype,
                 device: torch.device | None = None, *, contiguous: bool = True) -> None:
    """`shape` entries of None accept any size. Raises ValueError naming the argument."""
    import torch
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
