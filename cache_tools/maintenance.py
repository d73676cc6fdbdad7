"""Whole-layer scans: sizes, LRU prune, clear, stale staging. Writable layer only for changes."""
from __future__ import annotations

import os
import shutil
import time
from collections import Counter
from pathlib import Path

from ._fs import host_tag, pid_alive
from .layer import Layer, ManifestError, parse_manifest

STALE_STAGING_S = 3600.0
# A blob whose manifest is not written yet looks orphaned; its ctime (set by the link that
# published it) protects it from a concurrent prune for this long.
ORPHAN_GRACE_S = 600.0


def _unlink(path: str | Path) -> bool:
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def scan_blobs(layer: Layer) -> dict[str, tuple[int, float]]:
    """blob path -> (size, ctime)."""
    out: dict[str, tuple[int, float]] = {}
    try:
        shards = list(os.scandir(layer.dir("blobs")))
    except OSError:
        return out
    for shard in shards:
        if not shard.is_dir(follow_symlinks=False):
            continue
        try:
            for f in os.scandir(shard.path):
                try:
                    st = f.stat(follow_symlinks=False)
                except OSError:
                    continue
                out[f.path] = (st.st_size, st.st_ctime)
        except OSError:
            continue
    return out


def layer_usage(layer: Layer) -> tuple[int, int]:
    """(entries, bytes of blobs)."""
    n = sum(1 for _ in layer.iter_manifest_paths())
    return n, sum(size for size, _ in scan_blobs(layer).values())


def last_used(layer: Layer, key: str, manifest: dict, mpath: Path) -> float:
    """The last-used stamp's mtime; else the entry's creation time (never file atimes)."""
    try:
        return os.stat(layer.stamp_path(key)).st_mtime
    except OSError:
        pass
    created = manifest.get("created")
    if isinstance(created, (int, float)):
        return float(created)
    try:
        return mpath.stat().st_mtime
    except OSError:
        return 0.0


def count_quarantined(layer: Layer) -> int:
    try:
        return sum(1 for n in os.listdir(layer.dir("quarantine")) if n.endswith(".json"))
    except OSError:
        return 0


def prune_layer(layer: Layer, max_bytes: int, *, orphan_grace_s: float = ORPHAN_GRACE_S) -> dict:
    t0 = time.monotonic()
    now = time.time()
    entries: list[tuple[float, str, set[str], Path]] = []
    corrupt = 0
    for key, mpath in layer.iter_manifest_paths():
        try:
            m = parse_manifest(mpath.read_bytes(), key)
        except ManifestError:
            corrupt += _unlink(mpath)  # manifests are published whole, so this is real damage
            continue
        except OSError:
            continue
        blobs = {layer.blob_path(i["sha256"], n) for n, i in m["files"].items()}
        entries.append((last_used(layer, key, m, mpath), key, blobs, mpath))
    blobs = scan_blobs(layer)
    before = total = sum(s for s, _ in blobs.values())
    refs = Counter(b for e in entries for b in e[2])

    orphans = 0
    for path, (size, ctime) in blobs.items():
        if refs[path] == 0 and now - ctime > orphan_grace_s and _unlink(path):
            orphans += 1
            total -= size

    evicted: list[str] = []
    entries.sort()
    for _, key, eblobs, mpath in entries:
        if total <= max_bytes:
            break
        _unlink(mpath)  # manifest first: the entry disappears whole before its blobs go
        _unlink(layer.stamp_path(key))
        evicted.append(key)
        for b in eblobs:
            refs[b] -= 1
            if refs[b] == 0 and b in blobs and _unlink(b):
                total -= blobs[b][0]

    quarantine_removed = 0
    qdir = layer.dir("quarantine")
    try:
        for n in os.listdir(qdir):
            quarantine_removed += _unlink(qdir / n)
    except OSError:
        pass
    return {
        "layer": str(layer.root), "max_size_bytes": max_bytes, "bytes_before": before,
        "bytes_after": total, "freed_bytes": before - total, "entries_before": len(entries),
        "evicted": evicted, "evicted_count": len(evicted), "orphan_blobs_removed": orphans,
        "corrupt_manifests_removed": corrupt, "quarantine_files_removed": quarantine_removed,
        "seconds": round(time.monotonic() - t0, 4),
    }


def clear_layer(layer: Layer) -> dict:
    entries, nbytes = layer_usage(layer)
    # Manifests first, so a concurrent reader sees misses, never an entry without blobs.
    for sub in ("ac", "stamps", "quarantine", "blobs"):
        d = layer.dir(sub)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d, mode=0o700, exist_ok=True)
    _unlink(layer.stats_path)
    return {"layer": str(layer.root), "entries_removed": entries, "bytes_removed": nbytes}


def clean_stale_staging(staging_root: Path, *, max_age_s: float = STALE_STAGING_S) -> int:
    """Remove staging dirs whose writer is dead on this host/pid-namespace, or that are old."""
    mine = host_tag()
    removed = 0
    now = time.time()
    try:
        items = list(os.scandir(staging_root))
    except OSError:
        return 0
    for d in items:
        parts = d.name.split("-")
        try:
            age = now - d.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
        dead = False
        if len(parts) >= 3 and parts[0] == mine and parts[1].isdigit():
            dead = int(parts[1]) != os.getpid() and not pid_alive(int(parts[1]))
        if dead or age > max_age_s:
            if d.is_dir(follow_symlinks=False):
                shutil.rmtree(d.path, ignore_errors=True)
            else:
                _unlink(d.path)
            removed += 1
    return removed
