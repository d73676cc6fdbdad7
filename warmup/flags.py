"""Parse pasted `vllm serve` / `python -m sglang.launch_server` flags without importing either engine.

Only the flags that decide token shapes are understood; every other flag is recorded and otherwise
ignored, so a user can paste their whole serve command line.
"""
from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from dsv4_jit.errors import ConfigError

# Value kinds a flag can have. HRINT: an int that may carry vLLM's human-readable suffix ("16k", "1K").
INT, HRINT, FLOAT, BOOL, STR, INTLIST, JSON = "int", "hrint", "float", "bool", "str", "intlist", "json"


def norm_name(name: str) -> str:
    """`--Max_Num-Seqs` -> `max-num-seqs` (kebab-case, no dashes in front)."""
    return name.lstrip("-").strip().lower().replace("_", "-")


@dataclass(frozen=True)
class Flag:
    dest: str                     # key in the settings dict (snake_case, as the engine's config field)
    kind: str                     # INT | HRINT | FLOAT | BOOL | STR | INTLIST | JSON
    names: tuple[str, ...]        # accepted spellings, normalised by norm_name

    @property
    def display(self) -> str:
        n = self.names[0]
        return ("-" if len(n) <= 2 else "--") + n


class FlagTable:
    def __init__(self, engine: str, flags: Iterable[Flag], known_bools: Iterable[str] = ()):
        self.engine = engine
        self.by_name: dict[str, Flag] = {}
        self.by_dest: dict[str, Flag] = {}
        for f in flags:
            self.by_dest.setdefault(f.dest, f)
            for n in f.names:
                self.by_name[norm_name(n)] = f
        # Unrelated serve flags that take no value: knowing them keeps `--trust-remote-code MODEL`
        # from swallowing the positional model argument.
        self.known_bools = {norm_name(n) for n in known_bools}

    def lookup(self, name: str) -> Flag | None:
        return self.by_name.get(norm_name(name))


@dataclass
class Settings:
    """What the user asked for: values by dest, plus how each was spelled (for error messages)."""
    values: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)
    ignored: dict[str, Any] = field(default_factory=dict)      # unrelated flags, recorded
    positionals: list[str] = field(default_factory=list)

    def set(self, dest: str, value: Any, origin: str) -> None:
        self.values[dest] = value
        self.origin[dest] = origin

    def recorded(self) -> dict[str, Any]:
        """Unrelated flags plus positionals (e.g. the model after `vllm serve`), kept for the record."""
        out = dict(self.ignored)
        if self.positionals:
            out["_positional"] = list(self.positionals)
        return out

    def name(self, dest: str, default: str) -> str:
        return self.origin.get(dest, default)


# ---- value conversion ---------------------------------------------------------------------------

def to_int(value: Any, flag: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{flag}: expected an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value.strip()):
        return int(value.strip())
    raise ConfigError(f"{flag}: expected an integer, got {value!r}")


_DEC = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BIN = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def to_human_int(value: Any, flag: str) -> int:
    """An integer, or vLLM's `human_readable_int` form: '25.6k' -> 25600, '1K' -> 1024 (binary: no decimals)."""
    if isinstance(value, str):
        m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value.strip())
        if m:
            number, suffix = m.groups()
            if suffix in _DEC:
                return int(float(number) * _DEC[suffix])
            if "." not in number:
                return int(number) * _BIN[suffix]
            raise ConfigError(f"{flag}: decimals are not allowed with binary suffix {suffix} "
                              f"(got {value!r}; did you mean {number}{suffix.lower()}?)")
    return to_int(value, flag)


def to_float(value: Any, flag: str) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"{flag}: expected a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{flag}: expected a number, got {value!r}") from None


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def to_bool(value: Any, flag: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ConfigError(f"{flag}: expected true/false, got {value!r}")


def to_int_list(value: Any, flag: str) -> list[int]:
    """`[1,2,4]`, `"1,2,4"`, `"1 2 4"` or a list of those -> [1, 2, 4]."""
    if isinstance(value, str):
        s = value.strip()
        if s.startswith("["):
            try:
                value = json.loads(s)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{flag}: not a JSON list of integers ({e})") from None
        else:
            value = [p for p in re.split(r"[,\s]+", s) if p]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{flag}: expected a list of integers, got {value!r}")
    out: list[int] = []
    for v in value:
        if isinstance(v, str) and re.search(r"[,\s\[]", v.strip()):
            out.extend(to_int_list(v, flag))   # "1,2" or "[1, 2]" inside a list
        else:
            out.append(to_int(v, flag))
    return out


def to_json_dict(value: Any, flag: str) -> dict:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{flag}: not valid JSON ({e}); quote it, e.g. {flag} '{{\"key\": 1}}'") from None
        if isinstance(parsed, dict):
            return parsed
    raise ConfigError(f"{flag}: expected a JSON object, got {value!r}")


def convert(flag: Flag, value: Any, shown: str) -> Any:
    return {INT: to_int, HRINT: to_human_int, FLOAT: to_float, BOOL: to_bool, STR: lambda v, f: str(v),
            INTLIST: to_int_list, JSON: to_json_dict}[flag.kind](value, shown)


def _json_scalar(text: str) -> Any:
    """Value of a dotted sub-flag (`-O.cudagraph_mode=NONE`): JSON if it parses, else the string."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return text


# ---- the tokenizer ------------------------------------------------------------------------------

def _tokens(args: str | Sequence[str]) -> list[str]:
    if isinstance(args, str):
        return shlex.split(args)
    out: list[str] = []
    for a in args:
        if not isinstance(a, str):
            raise ConfigError(f"engine arguments must be strings, got {a!r}")
        out.append(a)
    return out


def _is_flag(tok: str) -> bool:
    # "-1" is a value, "-tp" / "--x" are flags.
    return tok.startswith("-") and len(tok) > 1 and not re.fullmatch(r"-\d+(\.\d*)?", tok)


_OPT_LEVEL = re.compile(r"^-O=?(\d+)$")   # vLLM's `-O3` / `-O=3`: the optimization level
OPT_LEVEL_FLAG = "optimization-level"    # tables with this flag read `-O<n>` as it, as vLLM 0.33 does


def parse_flags(args: str | Sequence[str], table: FlagTable, settings: Settings | None = None) -> Settings:
    """Parse a flag string/list into `settings` (later flags win, JSON dicts merge key by key)."""
    st = settings or Settings()
    toks = _tokens(args)
    i = 0
    while i < len(toks):
        tok = toks[i]
        i += 1
        if not _is_flag(tok):
            st.positionals.append(tok)       # `serve`, the model, `-m sglang.launch_server` leftovers
            continue
        m = _OPT_LEVEL.match(tok)
        if m:
            lvl = table.lookup(OPT_LEVEL_FLAG)
            if lvl is None:
                st.ignored[tok] = True
            else:
                st.set(lvl.dest, int(m.group(1)), tok)
            continue
        name, eq, inline = tok.partition("=")
        has_inline = bool(eq)
        base, dot, sub = norm_name(name).partition(".")
        flag = table.lookup(base)
        shown = name
        if flag is None:
            value: Any = True
            if has_inline:
                value = inline
            elif base not in table.known_bools and i < len(toks) and not _is_flag(toks[i]):
                value = toks[i]
                i += 1
            st.ignored[name] = value
            continue
        if dot:
            # `--compilation-config.cudagraph_mode NONE` / `-O.max_cudagraph_capture_size=64`
            if flag.kind != JSON:
                raise ConfigError(f"{name}: {flag.display} is not a JSON config flag; drop the '.{sub}'")
            if not has_inline:
                if i >= len(toks):
                    raise ConfigError(f"{name}: missing value")
                inline = toks[i]
                i += 1
            cur = dict(st.values.get(flag.dest) or {})
            node = cur
            parts = sub.replace("-", "_").split(".")
            for p in parts[:-1]:
                if not isinstance(node.get(p), dict):
                    node[p] = {}
                node = node[p]
            node[parts[-1]] = _json_scalar(inline)
            st.set(flag.dest, cur, flag.display)
            continue
        negated = False
        if flag.kind == BOOL:
            if has_inline:
                value = inline
            else:
                value = True
            negated = _is_negation(name, flag)
        elif has_inline:
            value = inline
        elif flag.kind == INTLIST:
            # nargs="+": take every following non-flag token.
            vals = []
            while i < len(toks) and not _is_flag(toks[i]):
                vals.append(toks[i])
                i += 1
            if not vals:
                raise ConfigError(f"{name}: missing value")
            value = vals
        else:
            if i >= len(toks):
                raise ConfigError(f"{name}: missing value")
            value = toks[i]
            i += 1
        if flag.kind == JSON and isinstance(value, str) and value.strip().isdigit():
            lvl = table.lookup(OPT_LEVEL_FLAG)
            if lvl is not None and norm_name(name) == "o":
                st.set(lvl.dest, int(value), f"{name} {value.strip()}")   # vLLM's `-O 3`: a level
                continue
            value = {"mode": int(value)}     # `--compilation-config 3`
        v = convert(flag, value, shown)
        if flag.kind == BOOL and negated:
            v = not v
        if flag.kind == JSON:
            v = {**(st.values.get(flag.dest) or {}), **v}
        st.set(flag.dest, v, shown)
    return st


def _is_negation(name: str, flag: Flag) -> bool:
    """`--no-enforce-eager` flips `--enforce-eager` (unless the flag itself is spelled `--no-...`)."""
    return norm_name(name).startswith("no-") and not norm_name(flag.names[0]).startswith("no-")


def bool_flag_names(*names: str) -> tuple[str, ...]:
    """A boolean flag's spellings plus the `--no-x` forms argparse's BooleanOptionalAction adds."""
    return tuple(names) + tuple("no-" + norm_name(n) for n in names)


def apply_mapping(data: Mapping[str, Any], table: FlagTable, where: str,
                  settings: Settings | None = None) -> Settings:
    """Profile-file keys (snake or kebab case) -> settings, reusing the flag table."""
    st = settings or Settings()
    for key, value in data.items():
        flag = table.lookup(key)
        shown = f"{key} (in {where})"
        if flag is None:
            st.ignored[key] = value
            continue
        v = convert(flag, value, shown)
        if flag.kind == BOOL and _is_negation(key, flag):
            v = not v
        if flag.kind == JSON:
            v = {**(st.values.get(flag.dest) or {}), **v}
        st.set(flag.dest, v, shown)
    return st
