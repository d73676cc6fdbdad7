"""Accept or refuse a pasted serve command line exactly as the engine's own parser would.

The engines' parsers are rebuilt with `argparse` from their option tables (argv_tables.py, generated from the
vLLM 0.33.0 and SGLang 0.5.23 wheels): the same option strings, nargs, choices and value types, so unknown
flags, ambiguous abbreviations, bad values and removed aliases are refused with the engine's own message, and
abbreviations it accepts are accepted. vLLM's `FlexibleArgumentParser` rewrites (underscores in names, `-O3`,
dotted `--x.key value` JSON fields) are applied first, as vLLM applies them.

Not reproduced: vLLM validates its JSON config flags with pydantic; here a value must be a JSON object (human-
readable numbers allowed) whose keys are the config dataclass's fields, and only the values the planner reads are
checked (by warmup/vllm.py); nested configs' keys are not checked.
`--config FILE` (a YAML of flags) is refused: paste the flags instead. SGLang's required `--model-path` may be
left out (the model is dsv4-jit's own `--model`).
"""
from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from functools import lru_cache
from typing import Any, Sequence

from dsv4_jit.errors import ConfigError

from . import argv_tables

ENGINE_TABLES = {"vllm": ("vllm serve", argv_tables.VLLM_0_33), "sglang": ("sglang serve", argv_tables.SGLANG_0_5_23)}


MODEL_STAND_IN = "(dsv4-jit --model)"


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):                       # argparse would print usage and exit 2
        raise _Refused(message)

    def exit(self, status=0, message=None):         # --help
        raise _Refused("--help: not a serve setting")


# ---- value types, named as the engines' own converters --------------------------------------------

_DEC = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BIN = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _vllm_human_int(value: str) -> int:
    """vllm.utils.argparse_utils.human_readable_int."""
    value = value.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if m:
        number, suffix = m.groups()
        if suffix in _DEC:
            return int(float(number) * _DEC[suffix])
        try:
            return int(number) * _BIN[suffix]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"Decimals are not allowed with binary suffixes like {suffix}. Did you mean to use "
                f"{number}{suffix.lower()} instead?") from None
    return int(value)


_vllm_human_int.__name__ = "human_readable_int"


def _vllm_human_int_or_auto(value: str) -> int:
    value = value.strip()
    if value == "-1" or value.lower() == "auto":
        return -1
    return _vllm_human_int(value)


_vllm_human_int_or_auto.__name__ = "human_readable_int_or_auto"

_SGL_UNITS = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def _sglang_human_int(value: str) -> int:
    """sglang.srt.utils.common.human_readable_int: SI (k, M, G, T) and IEC (Ki, Mi, Gi, Ti) suffixes."""
    s = value.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?", s)
    if not m:
        raise argparse.ArgumentTypeError(f"invalid human-readable integer: {value!r}")
    number, unit = m.groups()
    if unit is None:
        if "." in number:
            raise argparse.ArgumentTypeError(f"invalid human-readable integer: {value!r}")
        return int(number)
    if "." in number and unit.endswith("i"):
        raise argparse.ArgumentTypeError(f"decimals are not allowed with IEC suffix {unit}: {value!r}")
    return int(float(number) * _SGL_UNITS[unit])


_sglang_human_int.__name__ = "human_readable_int"


def _json_loads(value: str) -> Any:
    return json.loads(value)


_json_loads.__name__ = "loads"


def _expand_human_numbers(text: str) -> str:
    """Bare human-readable numbers inside a JSON value (`{"max_cudagraph_capture_size": 1k}`), as vLLM
    expands them before validating a config flag."""
    return re.sub(r'(?<=[:\[,\s])(\d+(?:\.\d+)?[kKmMgGtT])(?=\s*[,}\]])',
                  lambda m: str(_vllm_human_int(m.group(1))), text)


def _json_config(config: str, fields: Sequence[str]):
    """vLLM's `parse_dataclass` for one config dataclass: a JSON object whose keys are the dataclass's fields
    (its pydantic forbids others; the values of the keys the planner reads are checked in warmup/vllm.py)."""
    known = frozenset(fields)

    def parse_dataclass(value: str) -> Any:
        try:
            parsed = json.loads(_expand_human_numbers(value))
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"1 validation error for {config}: not valid JSON: {e}") from None
        if not isinstance(parsed, dict):
            raise argparse.ArgumentTypeError(f"1 validation error for {config}: expected a JSON object, "
                                             f"got {value!r}")
        extra = sorted(k for k in parsed if k not in known)
        if extra:
            n = len(extra)
            raise argparse.ArgumentTypeError(f"{n} validation error{'s' if n > 1 else ''} for {config}: "
                                             f"{', '.join(extra)}: Extra inputs are not permitted")
        return parsed
    return parse_dataclass


def _optional(inner):
    def _optional_type(value: str):
        if value in ("", "None"):
            return None
        try:
            return inner(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"Value {value} cannot be converted to {inner}.") from None
    return _optional_type


def _cuda_graph_backend(value: str) -> str:
    if value == "tc_piecewise":
        raise argparse.ArgumentTypeError("tc_piecewise was removed; select breakable, full, or disabled")
    return value


def _cuda_graph_config(value: str) -> dict:
    """sglang parse_cuda_graph_config_arg: a JSON object of phase -> settings object."""
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"--cuda-graph-config must be JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(f"--cuda-graph-config must be a JSON object, got {type(parsed).__name__}")
    for phase, settings in parsed.items():
        if str(phase) not in ("decode", "prefill"):
            raise argparse.ArgumentTypeError(f"--cuda-graph-config: unknown phase '{phase}', expected one of "
                                             "('decode', 'prefill')")
        if not isinstance(settings, dict):
            raise argparse.ArgumentTypeError(f"--cuda-graph-config['{phase}'] must be a JSON object, got "
                                             f"{type(settings).__name__}")
    return parsed


def _json_list(value: str):
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"Invalid JSON list: {value}. Please provide a valid JSON list.") from None


def _nullable_str(value: str):
    return None if not value or value == "None" else value


def _value_type(engine: str, kind: str, entry: dict):
    if kind.startswith("opt:"):
        return _optional(_value_type(engine, kind[4:], entry) or str)
    if kind == "parse_dataclass":
        return _json_config(entry["config"], entry["fields"])
    human = _vllm_human_int if engine == "vllm" else _sglang_human_int
    return {"int": int, "float": float, "str": None, "json": _json_loads, "human_readable_int": human,
            "human_readable_int_or_auto": _vllm_human_int_or_auto,
            "parse_cuda_graph_backend_arg": _cuda_graph_backend, "parse_cuda_graph_config_arg": _cuda_graph_config,
            "json_list_type": _json_list, "nullable_str": _nullable_str}.get(kind)


class _Choices(list):
    """Choices stored as strings, compared with the converted value's string form."""

    def __contains__(self, value):
        return str(value) in set(map(str, self))


class _Bool(argparse.Action):
    """BooleanOptionalAction / vLLM's EnableDisableAction: `--x` / `--enable-x` true, `--no-x` / `--disable-x` false."""

    def __init__(self, option_strings, dest, **kw):
        kw.pop("nargs", None)
        super().__init__(option_strings, dest, nargs=0, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        first = self.option_strings[0]
        neg = option_string.startswith("--no-") or (option_string.startswith("--disable-")
                                                     and not first.startswith("--disable-"))
        setattr(namespace, self.dest, not neg)


@lru_cache(maxsize=None)
def build_parser(engine: str) -> argparse.ArgumentParser:
    prog, table = ENGINE_TABLES[engine]
    p = _Parser(prog=prog, add_help=False)
    for a in table:
        opts, kind, dest = a["options"], a["action"], a["dest"]
        if kind == "help":
            p.add_argument(*opts, action="help")
            continue
        if not opts:                                  # vLLM's positional model_tag
            p.add_argument(dest, nargs=a["nargs"], default=None)
            continue
        kw: dict[str, Any] = {"dest": dest, "default": None}
        if kind in ("store_true", "DeprecatedStoreTrueAction"):
            kw["action"] = "store_true"
        elif kind == "store_false":
            kw["action"] = "store_false"
        elif kind == "bool_optional":
            kw["action"] = _Bool
        elif kind == "store_const":
            kw.update(action="store_const", const=a["const"])
        else:                                         # store, append and the engines' own store-like actions
            kw["action"] = "append" if kind == "append" else "store"
            if a["nargs"] not in (None, 0):
                kw["nargs"] = a["nargs"]
            t = _value_type(engine, a["type"], a)
            if t is not None:
                kw["type"] = t
            if a["choices"] is not None:
                kw["choices"] = _Choices(a["choices"])
        action = p.add_argument(*opts, **kw)
        for hidden in a["hidden"]:                    # parsed by the engine, not shown in its messages
            p._option_string_actions[hidden] = action
    return p


# ---- vLLM's FlexibleArgumentParser rewrites ---------------------------------------------------------

def _vllm_rewrite(args: list[str]) -> list[str]:
    """`FlexibleArgumentParser.parse_args` before argparse: `--model` moved in front, `_` -> `-` in names,
    `-O3` / `-O 3` -> `--optimization-level`, dotted `--json-flag.key value` merged into one JSON value."""
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            key, eq, value = arg.partition("=")
            head, dot, tail = key[2:].partition(".")
            out.append("--" + head.replace("_", "-") + dot + tail + eq + value)
        elif arg.startswith("-O") and arg != "-O":
            out += ["--optimization-level", arg[3:] if arg[2] == "=" else arg[2:]]
        elif arg == "-O" and i + 1 < len(args) and args[i + 1] in {"0", "1", "2", "3"}:
            out.append("--optimization-level")
        else:
            out.append(arg)
    dict_args: dict[str, dict] = defaultdict(dict)
    drop: set[int] = set()
    for i, arg in enumerate(out):
        if i in drop or not (arg.startswith("-") and "." in arg):
            continue
        name = arg
        if "=" in arg:
            name, value = arg.split("=", 1)
            if "." not in name:
                continue
        else:
            if i + 1 >= len(out):
                raise _Refused(f"argument {arg}: expected one argument")
            value = out[i + 1]
            drop.add(i + 1)
        if name.endswith("+"):
            name = name[:-1]
            value = json.dumps(value.split(","))
        key, *keys = name.split(".")
        try:
            parsed: Any = json.loads(value)
        except json.JSONDecodeError:
            try:
                parsed = _vllm_human_int(value)
            except (ValueError, argparse.ArgumentTypeError):
                parsed = value
        node = dict_args[key]
        for k in keys[:-1]:
            node = node.setdefault(k, {}) if isinstance(node.get(k), dict) or k not in node else node
            if not isinstance(node, dict):
                break
        node[keys[-1]] = parsed
        drop.add(i)
    out = [a for i, a in enumerate(out) if i not in drop]
    for key, value in dict_args.items():
        out += [key, json.dumps(value)]
    return out


def _strip_prefix(tokens: list[str], engine: str) -> list[str]:
    """Drop `vllm serve` / `python -m sglang.launch_server` / `sglang serve` in front of the flags."""
    toks = list(tokens)
    lead = {"vllm": (["vllm", "serve"], ["serve"]),
            "sglang": (["python", "-m", "sglang.launch_server"], ["python3", "-m", "sglang.launch_server"],
                       ["-m", "sglang.launch_server"], ["sglang", "serve"], ["serve"])}[engine]
    for prefix in lead:
        if toks[:len(prefix)] == prefix:
            return toks[len(prefix):]
    return toks


def check_argv(engine: str, tokens: Sequence[str]) -> dict[str, Any]:
    """The values the engine's parser reads from `tokens` (dest -> value, only those given), or a ConfigError
    with the engine's own reason."""
    prog, _ = ENGINE_TABLES[engine]
    args = _strip_prefix(list(tokens), engine)
    if any(a == "--config" or a.startswith("--config=") for a in args):
        raise ConfigError(f"{prog}: --config FILE is not read by dsv4-jit; paste the flags it holds instead")
    # The model: dsv4-jit takes its own --model, so a pasted line may leave it out; stand one in where the
    # engine expects it (SGLang requires --model-path; `vllm serve MODEL ...`), so messages read as the engine's.
    if engine == "sglang" and not any(a.split("=")[0] in ("--model-path", "--model") for a in args):
        args = ["--model-path", MODEL_STAND_IN] + args
    tries = [args]
    if engine == "vllm" and (not args or args[0].startswith("-")):
        tries = [[MODEL_STAND_IN] + args, args]      # the model may also come after the flags
    refusal = None
    for attempt in tries:
        try:
            ns = build_parser(engine).parse_args(_vllm_rewrite(attempt) if engine == "vllm" else attempt)
            break
        except _Refused as e:
            refusal = refusal or e
    else:
        raise ConfigError(f"{prog} refuses this command line: {refusal}") from None
    return {k: v for k, v in vars(ns).items() if v is not None and v != MODEL_STAND_IN}


def first_options(engine: str) -> dict[str, str]:
    """dest -> the engine's first spelling of it (`--tensor-parallel-size`), for messages."""
    return {a["dest"]: a["options"][0] for a in ENGINE_TABLES[engine][1] if a["options"]}
