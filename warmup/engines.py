"""Engine configs -> `EngineShapes`, from whatever the user has at hand.

Three inputs, one result:
  * the flags they pass to `vllm serve` / `python -m sglang.launch_server` (`parse_engine_args`);
  * a TOML or JSON profile file (`load_profile`);
  * the engine's own config object, read duck-typed (`shapes_from_config`); vLLM and SGLang are never
    imported.
Bad or contradictory values raise `ConfigError` naming the flag as the user spelled it.
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from dsv4_jit.errors import ConfigError

from . import sglang as _sglang
from . import vllm as _vllm
from .engine_argv import ENGINE_TABLES, check_argv, first_options
from .flags import Settings, _tokens, apply_mapping, norm_name, parse_flags
from .shapes import EngineShapes
from .sglang import SGLANG_FORMULA_VERSION
from .vllm import VLLM_FORMULA_VERSION

__all__ = ["EngineShapes", "ENGINES", "VLLM_FORMULA_VERSION", "SGLANG_FORMULA_VERSION", "parse_engine_args",
           "vllm_shapes", "sglang_shapes", "shapes_from_config", "load_profile", "Profile", "resolve_shapes"]

ENGINES = ("vllm", "sglang")
ENGINE_VERSIONS = {"vllm": "vLLM 0.33.0", "sglang": "SGLang 0.5.23"}


def _check_engine(engine: str) -> str:
    e = str(engine).strip().lower()
    if e not in ENGINES:
        raise ConfigError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")
    return e


def _table(engine: str):
    return _vllm.FLAGS if engine == "vllm" else _sglang.FLAGS


# Our own flags, not the engine's: the serving GPU and the VLLM_USE_V2_MODEL_RUNNER env var.
OWN_FLAGS = {"vllm": ("gpu_memory_gib", "gpu_name", "use_v2_model_runner"), "sglang": ("gpu_memory_gib",)}


def _split_own(engine: str, tokens: list[str]) -> tuple[list[str], list[str]]:
    """(our own flags with their values, the engine's command line)."""
    table = _table(engine)
    own_names = {norm_name(n) for d in OWN_FLAGS[engine] for n in table.by_dest[d].names}
    own, rest = [], []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        name = norm_name(tok.partition("=")[0]) if tok.startswith("--") else None
        if name in own_names:
            own.append(tok)
            flag = table.lookup(name)
            if "=" not in tok and flag.kind != "bool" and i + 1 < len(tokens):
                own.append(tokens[i + 1])
                i += 1
        else:
            rest.append(tok)
        i += 1
    return own, rest


def parse_argv(engine: str, args: str | Sequence[str], st: Settings) -> Settings:
    """A pasted serve command line into `st`: refused exactly where the engine's parser refuses it (with its
    reason), read from the values that parser produces."""
    table = _table(engine)
    tokens = _tokens(args)
    while tokens and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", tokens[0]):
        st.positionals.append(tokens.pop(0))       # `VLLM_USE_V2_MODEL_RUNNER=0 vllm serve ...`: the environment
    own, rest = _split_own(engine, tokens)
    if own:
        parse_flags(own, table, st)
    shown = first_options(engine)
    unmodelled = getattr(_sglang, "UNMODELLED", {}) if engine == "sglang" else {}
    for dest, value in check_argv(engine, rest).items():
        flag = table.by_dest.get(dest)
        if dest == "model_tag":
            st.positionals.append(value)
        elif flag is not None or dest in unmodelled:
            if flag is not None and flag.kind == "json" and isinstance(value, dict):
                value = {**(st.values.get(dest) or {}), **value}
            st.set(dest, value, shown.get(dest, dest))
        else:
            st.ignored[shown.get(dest, dest)] = value
    return st


def apply_settings(engine: str, data: Mapping[str, Any], where: str, st: Settings | None = None) -> Settings:
    """Settings by name (a profile table, the Python API): our names, or the engine's own option names. A name
    the engine's parser does not have is refused (a typo would plan the defaults); the engine's options that
    the formula refuses (SGLang's unmodelled ones) reach it; the rest is recorded."""
    st = st or Settings()
    before = set(st.ignored)
    st = apply_mapping(data, _table(engine), where, st)
    options = {a["dest"]: a["options"] for a in ENGINE_TABLES[engine][1] if a["options"]}
    spelled = {o: d for d, opts in options.items() for o in opts}
    unmodelled = getattr(_sglang, "UNMODELLED", {}) if engine == "sglang" else {}
    for key in [k for k in st.ignored if k not in before]:
        dest = spelled.get("--" + norm_name(key), norm_name(key).replace("-", "_"))
        if dest not in options:
            raise ConfigError(f"{key} (in {where}): {ENGINE_TABLES[engine][0]} has no such option "
                              f"({ENGINE_VERSIONS[engine]}); check the spelling")
        if dest in unmodelled:
            st.set(dest, st.ignored.pop(key), f"{key} (in {where})")
    return st


def _finish(engine: str, st: Settings, options: Mapping[str, Any]) -> EngineShapes:
    if engine == "vllm":
        return _vllm.shapes_from_settings(st, **options)
    return _sglang.shapes_from_settings(st, **options)


def parse_engine_args(engine: str, args: str | Sequence[str], *, gpu_memory_gib: float | None = None,
                      **options: Any) -> EngineShapes:
    """Shapes from a pasted serve command line (string or argv list).

    `--flag value`, `--flag=value`, kebab or snake case, `-tp 4`, JSON-valued flags and vLLM's dotted
    `--compilation-config.key value` all work; unrelated flags are recorded in `.ignored`.
    `options` go to the engine formula (vLLM: usage=, default_max_graph_size=; SGLang: use_mla=)."""
    engine = _check_engine(engine)
    st = Settings()
    if gpu_memory_gib is not None:
        st.set("gpu_memory_gib", gpu_memory_gib, "--gpu-memory-gib")
    st = parse_argv(engine, args, st)
    return _finish(engine, st, options)


def vllm_shapes(args: str | Sequence[str] | None = None, *, usage: str = "server",
                default_max_graph_size: int = _vllm.DEFAULT_MAX_GRAPH_SIZE, **settings: Any) -> EngineShapes:
    """Python API: `vllm_shapes(max_num_seqs=256, num_speculative_tokens=1, tensor_parallel_size=4)`."""
    st = apply_settings("vllm", settings, "vllm_shapes()")
    if args is not None:
        st = parse_argv("vllm", args, st)
    return _vllm.shapes_from_settings(st, usage=usage, default_max_graph_size=default_max_graph_size)


def sglang_shapes(args: str | Sequence[str] | None = None, *, use_mla: bool = True, **settings: Any) -> EngineShapes:
    """Python API: `sglang_shapes(cuda_graph_max_bs_decode=512, speculative_algorithm="EAGLE", ...)`."""
    st = apply_settings("sglang", settings, "sglang_shapes()")
    if args is not None:
        st = parse_argv("sglang", args, st)
    return _sglang.shapes_from_settings(st, use_mla=use_mla)


def shapes_from_config(cfg: Any, **options: Any) -> EngineShapes:
    """Shapes from a live engine config: a vLLM `VllmConfig` or an SGLang `ServerArgs` (duck-typed)."""
    if hasattr(cfg, "scheduler_config") or hasattr(cfg, "compilation_config"):
        return _vllm.shapes_from_settings(_vllm.settings_from_object(cfg), **options)
    if any(hasattr(cfg, a) for a in ("cuda_graph_max_bs_decode", "cuda_graph_config", "chunked_prefill_size")):
        return _sglang.shapes_from_settings(_sglang.settings_from_object(cfg), **options)
    raise ConfigError(f"cannot read engine shapes from {type(cfg).__name__}: expected a vLLM VllmConfig "
                      f"(.scheduler_config, .compilation_config) or an SGLang ServerArgs (.cuda_graph_max_bs_decode)")


# ---- profile files -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Profile:
    """A saved serving setup: engine shapes plus the optional model / arch it is for."""
    shapes: EngineShapes
    model: str | None = None
    arch: list[str] | None = None
    path: str = ""
    extra: dict = field(default_factory=dict)


_PROFILE_KEYS = {"engine", "model", "arch", "args"}


def _read_profile(path: Path) -> dict:
    text = path.read_text()
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON ({e})") from None
    else:
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover - exercised on 3.10 only
            try:
                import tomli as tomllib  # type: ignore[no-redef]
            except ImportError:
                raise ConfigError(f"{path}: TOML profiles need Python 3.11+ or the 'tomli' package "
                                  f"(pip install tomli); or write the profile as JSON") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a profile must be a table/object at the top level")
    return data


def load_profile(path: str | Path, *, gpu_memory_gib: float | None = None) -> Profile:
    """Read a TOML (.toml) or JSON (.json) profile:

        engine = "vllm"                    # or "sglang"; inferred from a [vllm]/[sglang] table
        model = "deepseek-v4-flash"        # optional
        arch = ["sm_90a"]                  # optional
        args = "--max-num-seqs 256 -tp 4"  # optional pasted flags (string or list)
        [vllm]                             # flag names as keys, snake or kebab case
        max_num_seqs = 256
        speculative_config = { num_speculative_tokens = 1 }
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--profile: no such file {str(path)!r}")
    data = _read_profile(p)
    tables = [e for e in ENGINES if isinstance(data.get(e), dict)]
    engine = data.get("engine")
    if engine is None:
        if len(tables) != 1:
            raise ConfigError(f"{p}: say engine = \"vllm\" or \"sglang\" (or use one [vllm]/[sglang] table)")
        engine = tables[0]
    engine = _check_engine(engine)
    table = _table(engine)
    where = p.name
    st = Settings()
    if gpu_memory_gib is not None:
        st.set("gpu_memory_gib", gpu_memory_gib, "--gpu-memory-gib")
    flat = {k: v for k, v in data.items() if k not in _PROFILE_KEYS and k not in ENGINES}
    st = apply_settings(engine, flat, where, st)
    if isinstance(data.get(engine), dict):
        st = apply_settings(engine, data[engine], where, st)
    if data.get("args") is not None:
        args = data["args"]
        if not isinstance(args, (str, list)):
            raise ConfigError(f"args (in {where}): expected a string or a list of strings")
        st = parse_argv(engine, args, st)
    arch = data.get("arch")
    if isinstance(arch, str):
        arch = [arch]
    if arch is not None and not (isinstance(arch, list) and all(isinstance(a, str) for a in arch)):
        raise ConfigError(f"arch (in {where}): expected a string or a list of strings")
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise ConfigError(f"model (in {where}): expected a string")
    return Profile(shapes=_finish(engine, st, {}), model=model, arch=arch, path=str(p))


def resolve_shapes(*, vllm_args: str | Sequence[str] | None = None, sglang_args: str | Sequence[str] | None = None,
                   profile: str | Path | None = None, gpu_memory_gib: float | None = None
                   ) -> tuple[EngineShapes, Profile | None]:
    """What the CLI calls: exactly one source, or none (vLLM server defaults, noted in the shapes)."""
    given = [n for n, v in (("--vllm-args", vllm_args), ("--sglang-args", sglang_args), ("--profile", profile))
             if v is not None]
    if len(given) > 1:
        raise ConfigError(f"give one of {', '.join(given)}, not several")
    if profile is not None:
        prof = load_profile(profile, gpu_memory_gib=gpu_memory_gib)
        return prof.shapes, prof
    if sglang_args is not None:
        return parse_engine_args("sglang", sglang_args, gpu_memory_gib=gpu_memory_gib), None
    shapes = parse_engine_args("vllm", vllm_args if vllm_args is not None else [], gpu_memory_gib=gpu_memory_gib)
    if vllm_args is None:
        shapes = EngineShapes(**{**shapes.__dict__, "notes": ("no engine flags given: vLLM serve defaults",)
                                 + shapes.notes})
    return shapes, None
