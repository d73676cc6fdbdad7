"""`SGLANG_EXTERNAL_MODEL_PACKAGE=dsv4_jit.engines.sglang_models`: route SGLang 0.5.23's SM12x TileLang calls
(mHC, indexer logits) to dsv4-jit, warmed from ServerArgs and sealed (`dsv4_jit.engines.sglang_route`).

SGLang imports this package in every process that resolves a model class (sglang/srt/models/registry.py) and
registers the `EntryClass` of each module in it. It has none: SGLang resolves every architecture, DeepSeek V4
included, to its own model class, loading its default registry on the first lookup. Importing the package
installs the route (`register`); `DSV4_JIT_SGLANG_ROUTE=0` turns it off.
"""
from __future__ import annotations

from ..sglang_route import register

ROUTE_INSTALLED = register()
