"""Compile keys: sha256 of canonical JSON of content-only fields.

Keys must not change when the cache moves between hosts, users or install paths
(DeepGEMM#388, vllm#47573), so check_key_fields rejects anything that looks local."""
from __future__ import annotations

import getpass
import hashlib
import json
import os
import re
import socket
from typing import Any

from .errors import KeyFieldError

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_TOKEN_SPLIT = re.compile(r"[^A-Za-z0-9]+")


def canonical_json(fields: dict) -> bytes:
    try:
        return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise KeyFieldError(f"key fields are not canonical JSON: {e}") from None


def compute_key(fields: dict) -> str:
    """sha256 hex of the canonical JSON (sorted keys, compact separators) of `fields`."""
    if not isinstance(fields, dict):
        raise KeyFieldError(f"key fields must be a dict, got {type(fields).__name__}")
    return hashlib.sha256(canonical_json(fields)).hexdigest()


def is_key(key: Any) -> bool:
    return isinstance(key, str) and _HEX64.match(key) is not None


def check_key(key: Any) -> str:
    if not is_key(key):
        raise KeyFieldError(f"cache key must be 64 lowercase hex chars (sha256), got {key!r}")
    return key


def _local_identity() -> tuple[str | None, set[str], set[str]]:
    """(HOME, hostnames, usernames) of this process; empty parts are skipped."""
    home = os.path.expanduser("~")
    home = home if home not in ("", "/", "~") else None
    hosts: set[str] = set()
    try:
        h = socket.gethostname()
        if h:
            hosts |= {h, h.split(".")[0]}
    except OSError:
        pass
    users: set[str] = set()
    for getter in (getpass.getuser, lambda: os.environ.get("USER", ""), lambda: os.environ.get("LOGNAME", "")):
        try:
            u = getter()
        except Exception:  # getpass raises when no passwd entry exists (containers)
            u = ""
        if u:
            users.add(u)
    return home, {h for h in hosts if h}, users


def _check_str(s: str, where: str, ident: tuple[str | None, set[str], set[str]]) -> None:
    home, hosts, users = ident
    if os.path.isabs(s) or s.startswith("~") or re.match(r"^[A-Za-z]:[\\/]", s):
        raise KeyFieldError(f"key field {where} = {s!r} is an absolute path; keys must be content only "
                            "(hash the file's content instead, so a relocated cache still hits)")
    if home and home in s:
        raise KeyFieldError(f"key field {where} = {s!r} contains HOME ({home}); keys must be content only")
    tokens = set(_TOKEN_SPLIT.split(s))
    for h in hosts:
        # Dotted FQDNs are distinctive enough to match as substrings; short names match whole tokens.
        if ("." in h and h in s) or h in tokens:
            raise KeyFieldError(f"key field {where} = {s!r} contains the hostname {h!r}; keys must be content only")
    for u in users:
        if u in tokens:
            raise KeyFieldError(f"key field {where} = {s!r} contains the user name {u!r}; keys must be content only")


def check_key_fields(fields: dict) -> None:
    """Raise KeyFieldError if any key or value (recursively) is an absolute path or names HOME/host/user."""
    if not isinstance(fields, dict):
        raise KeyFieldError(f"key fields must be a dict, got {type(fields).__name__}")
    canonical_json(fields)  # also rejects non-JSON values and NaN
    ident = _local_identity()

    def walk(v: Any, where: str) -> None:
        if isinstance(v, str):
            _check_str(v, where, ident)
        elif isinstance(v, dict):
            for k, sub in v.items():
                if isinstance(k, str):
                    _check_str(k, f"{where} (a key)", ident)
                walk(sub, f"{where}[{k!r}]")
        elif isinstance(v, (list, tuple)):
            for i, sub in enumerate(v):
                walk(sub, f"{where}[{i}]")

    walk(fields, "fields")
