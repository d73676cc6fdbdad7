"""Load vLLM 0.33.0's and SGLang 0.5.23's own argument parsers from their wheels, without installing them.

Run as a child process (it installs stub modules into sys.modules):

    python tests/engine_peer_loader.py PEERS_DIR fetch            # download + unzip both wheels, install deps
    python tests/engine_peer_loader.py PEERS_DIR vllm|sglang < request.json
        request {"argvs": [[...], ...], "resolve": [{"argv": [...], "gpu_gib": 80}, ...]} (resolve: SGLang)
        answer  {"table": the parser's actions, "parse": per argv, "resolve": per request}

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
              "watchfiles", "flashinfer", "tilelang", "tvm_ffi", "uvloop", "psutil", "requests", "tqdm", "urllib3")
SGLANG_STUBS = ("pybase64", "safetensors", "triton", "PIL", "starlette", "zmq", "psutil", "requests", "tqdm", "IPython")


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


def _config_class(t):
    """The config dataclass behind vLLM's `parse_dataclass` (or `optional_type(parse_dataclass)`), else None."""
    import dataclasses
    if t is not None and getattr(t, "__qualname__", "").startswith("optional_type.") and t.__closure__:
        t = t.__closure__[0].cell_contents
    cls = (getattr(t, "__defaults__", None) or (None,))[0]
    return cls if isinstance(cls, type) and dataclasses.is_dataclass(cls) else None


def _choice_list(choices) -> list[str]:
    out = [str(c) for c in choices]
    return sorted(out) if isinstance(choices, (set, frozenset)) else out   # a set has no order to keep


def table(parser: argparse.ArgumentParser) -> list[dict]:
    out = []
    for a in parser._actions:
        nargs = a.nargs
        # vLLM's EnableDisableAction shows `--enable-x/--disable-x` but still parses `--no-enable-x`
        hidden = sorted(o for o, act in parser._option_string_actions.items()
                        if act is a and o not in a.option_strings)
        entry = {}
        config_cls = _config_class(a.type)
        if config_cls is not None:                    # vLLM's parse_dataclass: its pydantic refuses other keys
            import dataclasses
            entry = {"config": config_cls.__name__,
                     "fields": sorted(f.name for f in dataclasses.fields(config_cls))}
        out.append({**entry, "options": list(a.option_strings), "hidden": hidden, "dest": a.dest,
                    "action": _action_kind(a),
                    "nargs": nargs, "type": _type_kind(a.type),
                    "choices": None if a.choices is None else _choice_list(a.choices),
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


def parse_all(parser: argparse.ArgumentParser, argvs: list[list[str]]) -> list[dict]:
    """Each argv through the engine's own parse_args: {"ok": True, "values": {dest: value given}} or
    {"ok": False, "error": the message after "error: "}."""
    unset = object()
    for action in parser._actions:
        if action.default is not argparse.SUPPRESS:
            action.default = unset                    # so only what the command line gave is reported
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
        except Exception as e:   # noqa: BLE001 - a refusal raised past argparse (a config validator)
            results.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
            continue
        values = {k: _jsonable(v) for k, v in vars(ns).items() if v is not unset}
        results.append({"ok": True, "values": values})
    return results


def sglang_resolve(parser: argparse.ArgumentParser, requests: list[dict]) -> list[dict]:
    """SGLang 0.5.23's own CUDA-graph resolution for each {"argv", "gpu_gib"}: `parse_cuda_graph_config`, then
    `handle_gpu_memory_settings` with the GPU's memory given (its later, model-dependent steps are cut off
    once the graph config is declared). DeepSeek V4 uses MLA attention."""
    from sglang.srt.arg_groups import cuda_graph_hook, memory_hook
    from sglang.srt.arg_groups.overrides import resolution_result
    from sglang.srt.server_args import ServerArgs
    memory_hook.use_mla_backend = lambda server_args: True
    out = []
    for req in requests:
        memory_hook.get_device_memory_capacity = lambda device=None, gib=req["gpu_gib"]: gib * 1024
        sa = ServerArgs.from_cli_args(parser.parse_args(["--model-path", "m", *req["argv"]]))
        try:
            cuda_graph_hook.parse_cuda_graph_config(sa)
            cuda_graph_hook.validate_cuda_graph_config(sa)
        except Exception as e:   # noqa: BLE001 - SGLang's refusal
            out.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
            continue
        try:
            memory_hook.handle_gpu_memory_settings(sa)
        except Exception:        # noqa: BLE001 - past the graph settings it needs the model's config
            pass
        cfg = resolution_result(sa, "cuda_graph_config")
        out.append({"ok": True, "chunked_prefill_size": resolution_result(sa, "chunked_prefill_size"),
                    **{phase: {k: getattr(getattr(cfg, phase), k) for k in ("backend", "max_bs", "bs")}
                       for phase in ("decode", "prefill")}})
    return out


def vllm_resolve(parser: argparse.ArgumentParser, requests: list[dict]) -> list[dict]:
    """vLLM 0.33.0's own resolution for each {"argv", "gpu_gib", "gpu_name", "capability_family"}: `EngineArgs.from_cli_args`,
    `EngineArgs._set_default_max_num_seqs_and_batched_tokens_args` (batch defaults of that GPU, server usage),
    `SchedulerConfig` (its checks), then `VllmConfig._set_cudagraph_sizes` on a stand-in holding the real
    `SchedulerConfig` / `CompilationConfig` (a VllmConfig needs a ModelConfig, i.e. a model download). The
    compilation-config glue of `create_engine_config` (the two size flags copied into it) is repeated here."""
    import copy
    from vllm.config import CompilationConfig, SchedulerConfig, VllmConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform
    from vllm.usage.usage_lib import UsageContext
    out = []
    for req in requests:
        gib, name = req["gpu_gib"], req["gpu_name"]
        current_platform.get_device_total_memory = lambda device_id=0, gib=gib: int(gib * 2**30)
        current_platform.get_device_name = lambda device_id=0, name=name: name
        current_platform.is_device_capability = lambda capability, device_id=0: False
        family = req.get("capability_family")     # 100: datacenter Blackwell (B200 / B300)
        current_platform.is_device_capability_family = lambda capability, device_id=0, f=family: capability == f
        try:
            ea = EngineArgs.from_cli_args(parser.parse_args(req["argv"]))
            if ea.enable_chunked_prefill is None:
                ea.enable_chunked_prefill = True          # create_engine_config's default before the batch defaults
            mml = ea.max_model_len if ea.max_model_len and ea.max_model_len > 0 else 1048576
            model = types.SimpleNamespace(max_model_len=mml, enforce_eager=bool(ea.enforce_eager),
                                          is_multimodal_model=False)
            ea._set_default_max_num_seqs_and_batched_tokens_args(
                UsageContext.OPENAI_API_SERVER, model, types.SimpleNamespace(use_batched_dp_moe=False))
            cc = copy.deepcopy(ea.compilation_config) or CompilationConfig()
            if ea.cudagraph_capture_sizes is not None:
                if cc.cudagraph_capture_sizes is not None:
                    raise ValueError("cudagraph_capture_sizes and compilation_config.cudagraph_capture_sizes are "
                                     "mutually exclusive")
                cc.cudagraph_capture_sizes = ea.cudagraph_capture_sizes
            if ea.max_cudagraph_capture_size is not None:
                if cc.max_cudagraph_capture_size is not None:
                    raise ValueError("max_cudagraph_capture_size and compilation_config.max_cudagraph_capture_size "
                                     "are mutually exclusive")
                cc.max_cudagraph_capture_size = ea.max_cudagraph_capture_size
            chunked = bool(ea.enable_chunked_prefill)
            sc = SchedulerConfig(max_num_seqs=ea.max_num_seqs, max_num_batched_tokens=ea.max_num_batched_tokens,
                                 max_model_len=mml, is_encoder_decoder=False, enable_chunked_prefill=chunked)
            spec = ea.speculative_config or {}
            k = int(spec.get("num_speculative_tokens") or ea.spec_tokens or 0)
            spec_obj = None if not k else types.SimpleNamespace(num_speculative_tokens=k,
                                                                uses_dynamic_speculative_decoding=lambda: False)
            stub = types.SimpleNamespace(model_config=model, compilation_config=cc, scheduler_config=sc,
                                         speculative_config=spec_obj, performance_mode=ea.performance_mode,
                                         uniform_decode_query_len=1 + k, num_speculative_tokens=k)
            VllmConfig._set_cudagraph_sizes(stub)
        except Exception as e:   # noqa: BLE001 - vLLM's refusal
            out.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
            continue
        out.append({"ok": True, "max_num_seqs": sc.max_num_seqs, "max_num_batched_tokens": sc.max_num_batched_tokens,
                    "sizes": list(cc.cudagraph_capture_sizes or []),
                    "max_cudagraph_capture_size": cc.max_cudagraph_capture_size})
    return out


def vllm_warmup_forwards(requests: list[dict]) -> list[list[int]]:
    """The token count of every forward vLLM 0.33.0's own `warmup_kernels` (V2 model runner,
    `v1/worker/gpu/warmup.py`, run between `kernel_warmup` and `capture_model`) hands the model, for each
    {"max_num_seqs", "max_num_batched_tokens", "num_spec", "num_blocks"}: the real function driven with a
    stand-in runner whose `execute_model` records `total_num_scheduled_tokens`."""
    import torch
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability
    current_platform.get_device_capability = lambda device_id=0: DeviceCapability(9, 0)
    runner_mod = types.ModuleType("vllm.v1.worker.gpu.model_runner")
    runner_mod.GPUModelRunner = object                # a type annotation there; the runner is a stand-in
    sys.modules.setdefault("vllm.v1.worker.gpu.model_runner", runner_mod)
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    from vllm.v1.worker.gpu import warmup
    torch.accelerator.synchronize = lambda *a, **k: None
    out = []
    for req in requests:
        k = int(req["num_spec"])
        spec = FullAttentionSpec(block_size=64, num_kv_heads=1, head_size=512, dtype=torch.bfloat16)
        group = types.SimpleNamespace(kv_cache_spec=spec)
        sched = types.SimpleNamespace(max_num_seqs=req["max_num_seqs"],
                                      max_num_batched_tokens=req["max_num_batched_tokens"])
        runner = types.SimpleNamespace(
            adaptive_verification=None, rejection_sampler=None, speculative_config=object() if k else None,
            vllm_config=types.SimpleNamespace(is_mm_encoder_only=False, num_lookahead_tokens=k),
            num_speculative_steps=k, decode_query_len=1 + k, is_pooling_model=False, is_encoder_decoder=False,
            model_state=types.SimpleNamespace(), max_model_len=1 << 20, max_num_reqs=req["max_num_seqs"],
            kv_cache_config=types.SimpleNamespace(kv_cache_groups=[group], num_blocks=req.get("num_blocks", 1 << 20)),
            block_tables=None, scheduler_config=sched, kv_block_zeroer=None, is_last_pp_rank=False,
            kv_connector=types.SimpleNamespace(set_disabled=lambda flag: None))
        seen: list[int] = []

        def execute_model(scheduler_output, seen=seen):
            if scheduler_output.total_num_scheduled_tokens:
                seen.append(int(scheduler_output.total_num_scheduled_tokens))
        warmup.warmup_kernels(runner, execute_model, lambda grammar_output: None)
        out.append(seen)
    return out


WHEELS = {  # pure-Python files are all that is read; fixed tags, so any CI Python fetches the same files
    "vllm": ("vllm==0.33.0", ["--python-version", "3.12", "--platform", "manylinux_2_28_x86_64"]),
    "sglang": ("sglang==0.5.23", ["--python-version", "3.12", "--platform", "manylinux_2_34_x86_64"]),
}
DEPS = ("pydantic>=2.12", "msgspec", "pyyaml", "regex", "orjson")   # what the two parsers run for real


def fetch(peers: str) -> None:
    """`pip download --no-deps` both wheels into PEERS_DIR/wheels, unzip their non-binary files into
    PEERS_DIR/<engine>, `pip install --target PEERS_DIR/deps` the parsers' few real dependencies."""
    import glob
    import subprocess
    import zipfile
    root = os.path.abspath(peers)
    wheels = os.path.join(root, "wheels")
    for engine, (req, tags) in WHEELS.items():
        dest = os.path.join(root, engine)
        if os.path.isfile(os.path.join(dest, "COMPLETE")):
            continue
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--implementation", "cp", *tags, "-d", wheels, req], check=True)
        wheel = sorted(glob.glob(os.path.join(wheels, req.replace("==", "-") + "-*.whl")))[-1]
        with zipfile.ZipFile(wheel) as z:
            z.extractall(dest, [n for n in z.namelist() if n.startswith(engine + "/") and not n.endswith(".so")])
        open(os.path.join(dest, "COMPLETE"), "w").write(os.path.basename(wheel) + "\n")
        os.remove(wheel)                              # only the unzipped Python files are read
    deps = os.path.join(root, "deps")
    if not os.path.isfile(os.path.join(deps, "COMPLETE")):
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-warn-conflicts", "--target", deps,
                        *DEPS], check=True)
        open(os.path.join(deps, "COMPLETE"), "w").write("\n".join(DEPS) + "\n")


def main(argv: list[str]) -> int:
    """PEERS_DIR fetch | PEERS_DIR ENGINE (a JSON request on stdin: {"argvs": [...], "resolve": [...]})."""
    if argv[1:] == ["fetch"]:
        fetch(argv[0])
        return 0
    peers, engine = argv
    request = json.load(sys.stdin)
    _setup(peers, engine)
    parser = vllm_parser() if engine == "vllm" else sglang_parser()
    answer = {"table": table(parser)}
    if request.get("warmup_forwards"):
        answer["warmup_forwards"] = vllm_warmup_forwards(request["warmup_forwards"])
    if request.get("resolve"):
        answer["resolve"] = (vllm_resolve if engine == "vllm" else sglang_resolve)(parser, request["resolve"])
    answer["parse"] = parse_all(parser, request.get("argvs", []))
    json.dump(answer, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
