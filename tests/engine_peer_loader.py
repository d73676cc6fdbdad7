"""Load vLLM 0.33.0's and SGLang 0.5.23's own argument parsers from their wheels, without installing them.

Run as a child process (it installs stub modules into sys.modules):

    python tests/engine_peer_loader.py PEERS_DIR vllm|sglang table          # the parser's actions, as JSON
    python tests/engine_peer_loader.py PEERS_DIR vllm|sglang parse < argvs  # each argv: accepted + values, or the error

PEERS_DIR holds `vllm/` and `sglang/` (the wheels' Python files, unzipped) and `deps/` (pydantic, msgspec,
pyyaml, regex: what the two parsers need for real). Everything else either engine imports while building
its parser (tokenizers, web servers, GPU libraries) is replaced by an inert stub: parsing a command line
never calls into them. The engines' code is read from the wheels at run time and never copied.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import importlib.machinery
import io
import json
import os
import sys
import types

# Imported by the engines while building their parsers, not needed to parse.
VLLM_STUBS = ("huggingface_hub", "transformers", "cachetools", "blake3", "cbor2", "tokenizers", "safetensors", "zmq",
              "pybase64", "openai", "fastapi", "starlette", "aiohttp", "prometheus_client", "tiktoken",
              "sentencepiece", "mistral_common", "cpuinfo", "gguf", "einops", "numba", "PIL", "setproctitle",
              "cloudpickle", "openai_harmony", "mcp", "anthropic", "partial_json_parser", "pydantic_extra_types",
              "opentelemetry", "llguidance", "xgrammar", "outlines_core", "lark", "jsonschema", "ijson", "orjson",
              "watchfiles", "flashinfer", "tilelang", "tvm_ffi", "uvloop", "psutil", "requests", "tqdm")
SGLANG_STUBS = ("pybase64", "triton", "PIL", "starlette", "zmq", "psutil", "requests", "tqdm")


class _AnyType(type):
    """A stub class: any attribute is another stub, calling it returns one (or passes a decorated function)."""

    def __get_pydantic_core_schema__(cls, source, handler):
        from pydantic_core import core_schema
        return core_schema.any_schema()

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub_class(name)

    def __call__(cls, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return _stub_class("instance")

    def __getitem__(cls, item):
        return cls

    def __or__(cls, other):
        return cls

    __ror__ = __or__

    def __iter__(cls):
        return iter(())

    def __bool__(cls):
        return False


def _stub_class(name: str) -> type:
    return _AnyType(name, (), {})


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name == "__version__":
            return "0.0.0"
        if name.startswith("__"):
            raise AttributeError(name)
        value = _stub_class(name)
        setattr(self, name, value)
        return value


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots):
        self.roots = frozenset(roots)

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def _setup(peers: str, engine: str) -> None:
    os.environ.setdefault("DSV4_JIT_VLLM_PLUGIN", "0")
    sys.path[:0] = [os.path.join(peers, "deps"), os.path.join(peers, engine)]
    sys.meta_path.insert(0, _StubFinder(VLLM_STUBS if engine == "vllm" else SGLANG_STUBS))


def vllm_parser() -> argparse.ArgumentParser:
    for name in ("vllm._C", "vllm._C_stable_libtorch", "vllm._moe_C", "vllm.cumem_allocator"):
        sys.modules[name] = types.ModuleType(name)    # compiled extensions: not in the unzipped files
    import vllm.platforms as platforms
    from vllm.platforms.cuda import CudaPlatform
    platforms._current_platform = CudaPlatform()      # the defaults `vllm serve` shows on an NVIDIA GPU
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    return make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))


def sglang_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs
    parser = argparse.ArgumentParser(prog="sglang serve")   # as prepare_server_args builds it
    ServerArgs.add_cli_args(parser)
    return parser


def _type_kind(t) -> str:
    if t is None:
        return "str"
    name = getattr(t, "__qualname__", repr(t))
    if t in (int, float, str):
        return t.__name__
    if name.startswith("optional_type."):
        inner = t.__closure__[0].cell_contents if t.__closure__ else None
        return "opt:" + _type_kind(inner)
    if getattr(t, "__module__", "") == "json" and name == "loads":
        return "json"
    return name.split(".<locals>.")[-1].split(".")[-1]


def _action_kind(a) -> str:
    n = type(a).__name__
    return {"_StoreAction": "store", "_StoreTrueAction": "store_true", "_StoreFalseAction": "store_false",
            "_StoreConstAction": "store_const", "_AppendAction": "append", "_HelpAction": "help",
            "BooleanOptionalAction": "bool_optional", "EnableDisableAction": "bool_optional",
            "_CountAction": "count", "_VersionAction": "help"}.get(n, n)


def table(parser: argparse.ArgumentParser) -> list[dict]:
    out = []
    for a in parser._actions:
        nargs = a.nargs
        out.append({"options": list(a.option_strings), "dest": a.dest, "action": _action_kind(a),
                    "nargs": nargs, "type": _type_kind(a.type),
                    "choices": None if a.choices is None else [str(c) for c in a.choices],
                    "const": a.const if isinstance(a.const, (int, float, str, bool)) or a.const is None else
                    str(a.const)})
    return out


def _jsonable(v):
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return repr(v)


def parse_all(parser: argparse.ArgumentParser, argvs: list[list[str]], engine: str) -> list[dict]:
    """Each argv through the engine's own parse_args: {"ok": True, "values": {...}} or {"ok": False, "error": ...}."""
    defaults = vars(parser.parse_args(["m"] if engine == "vllm" else []))
    results = []
    for argv in argvs:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ns = parser.parse_args(list(argv))
        except SystemExit:
            lines = [ln for ln in err.getvalue().splitlines() if ": error: " in ln]
            results.append({"ok": False, "error": lines[-1].split(": error: ", 1)[1] if lines else err.getvalue()})
            continue
        except Exception as e:   # noqa: BLE001 - a refusal raised outside argparse (e.g. ValueError)
            results.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
            continue
        values = {k: _jsonable(v) for k, v in vars(ns).items() if k in defaults and v != defaults[k]}
        results.append({"ok": True, "values": values})
    return results


def main(argv: list[str]) -> int:
    peers, engine, what = argv
    _setup(peers, engine)
    parser = vllm_parser() if engine == "vllm" else sglang_parser()
    if what == "table":
        json.dump(table(parser), sys.stdout)
    else:
        json.dump(parse_all(parser, json.load(sys.stdin), engine), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
