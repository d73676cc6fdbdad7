"""One cache layer on disk (a root dir) and its v1 layout.

    v1/ac/<k[:2]>/<key>.json       entry manifests (the action index), written last
    v1/blobs/<h[:2]>/<sha><suffix> content-addressed files, 0444
    v1/stamps/<key>                last-used stamp (mtime), never atime
    v1/locks/ staging/ quarantine/ stats.json
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from ._fs import blob_relpath

LAYOUT = "v1"
MANIFEST_FORMAT = 1
SUBDIRS = ("ac", "blobs", "locks", "staging", "quarantine", "stamps")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class ManifestError(ValueError):
    """A manifest that is not a whole, well-formed entry (internal; becomes a quarantine)."""


@dataclass
class Layer:
    root: Path
    writable: bool
    memory_only: bool = False
    # Precomputed string prefixes: the warm lookup path builds paths by concatenation.
    _ac: str = field(init=False, repr=False)
    _blobs: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self.v = self.root / LAYOUT
        self._ac = str(self.v / "ac") + os.sep
        self._blobs = str(self.v / "blobs") + os.sep
        self._stamps = str(self.v / "stamps") + os.sep
        self.label = self._label()  # stats key; computed once, read on every lookup

    def dir(self, name: str) -> Path:
        return self.v / name

    @property
    def stats_path(self) -> Path:
        return self.v / "stats.json"

    def _label(self) -> str:
        if self.memory_only:
            return "memory-only"
        return "writable" if self.writable else str(self.root)

    def manifest_path(self, key: str) -> str:
        return f"{self._ac}{key[:2]}{os.sep}{key}.json"

    def blob_path(self, sha: str, name: str) -> str:
        return self._blobs + blob_relpath(sha, name)

    def stamp_path(self, key: str) -> str:
        return self._stamps + key

    def lock_path(self, key: str) -> str:
        return str(self.v / "locks" / f"{key}.lock")

    def has_layout(self) -> bool:
        return (self.v / "ac").is_dir()

    def iter_manifest_paths(self) -> Iterator[tuple[str, Path]]:
        ac = self.v / "ac"
        try:
            shards = sorted(os.scandir(ac), key=lambda d: d.name)
        except OSError:
            return
        for shard in shards:
            if not shard.is_dir(follow_symlinks=False):
                continue
            try:
                names = sorted(os.listdir(shard.path))
            except OSError:
                continue
            for n in names:
                if n.endswith(".json") and _HEX64.match(n[:-5]):
                    yield n[:-5], Path(shard.path, n)


def parse_manifest(raw: bytes, key: str) -> dict:
    """Decode and minimally validate a manifest; ManifestError if it is not a whole entry."""
    try:
        m = json.loads(raw.decode("utf-8"))
    except ValueError as e:
        raise ManifestError(f"manifest is not valid JSON ({e})") from None
    if not isinstance(m, dict) or m.get("key") != key:
        raise ManifestError("manifest does not describe this key")
    if m.get("format") != MANIFEST_FORMAT:
        raise ManifestError(f"unknown manifest format {m.get('format')!r}")
    files = m.get("files")
    if not isinstance(files, dict) or not files:
        raise ManifestError("manifest lists no files")
    for name, info in files.items():
        # ascii-alnum of length 64 keeps the derived blob path inside blobs/ (cheaper than a regex);
        # whether it is the right hash is what verification is for.
        try:
            sha = info["sha256"]
            ok = len(sha) == 64 and sha.isascii() and sha.isalnum() and type(info["size"]) is int
        except (TypeError, KeyError):
            ok = False
        if not ok:
            raise ManifestError(f"bad file record for {name!r}")
        # Names are not path-checked here (hot path): blob paths come from sha + a regex-checked
        # suffix only, so a name can never steer a path; publish and import check names.
    return m


def encode_manifest(m: dict) -> bytes:
    return json.dumps(m, sort_keys=True, separators=(",", ":")).encode("utf-8")
