"""What the vLLM peer loaders share: empty stand-in packages whose __path__ points into .peers (so the fetched
files import as the real ones without running vllm's __init__), and vllm.platforms' CUDA platform reduced to the
capability questions the fetched files ask."""
from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any, Callable

STUB_MARK = "__dsv4_peer_stub__"


def stub(name: str, **attrs: Any) -> types.ModuleType:
    """A module named `name` holding `attrs`, installed in sys.modules and marked as ours."""
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    setattr(m, STUB_MARK, True)
    sys.modules[name] = m
    return m


def stub_packages(peers: Path, packages: tuple[str, ...]) -> None:
    """Each package an empty stand-in over its .peers folder; one another peer loader made already stays."""
    have = sys.modules.get("vllm")
    if have is not None and not getattr(have, STUB_MARK, False):
        raise RuntimeError("a real vllm is already imported in this process; load the peer in a fresh one")
    for pkg in packages:
        m = sys.modules.get(pkg)
        if m is not None and getattr(m, STUB_MARK, False):
            continue
        stub(pkg, __path__=[str(peers.joinpath(*pkg.split(".")))])


class CudaPlatform:
    """vllm.platforms.current_platform on CUDA: the platform and capability questions; `capability` gives
    (major, minor)."""

    def __init__(self, capability: Callable[[], tuple[int, int]]) -> None:
        self._capability = capability

    def is_cuda(self) -> bool:
        return True

    def is_rocm(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return False

    def has_device_capability(self, cap: int) -> bool:
        major, minor = self._capability()
        return major * 10 + minor >= cap

    def is_device_capability(self, cap: int) -> bool:
        major, minor = self._capability()
        return major * 10 + minor == cap

    def is_device_capability_family(self, family: int) -> bool:
        return self._capability()[0] == family // 10
