"""`dsv4-jit cache ...`: dir | ls | stats | verify | prune | clear | export | import."""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from typing import Any, Sequence

from .errors import CacheError

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """'10G', '500M', '1.5GiB', '4096' -> bytes (binary units)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise CacheError(f"bad size {text!r}: use bytes or a number with K, M, G or T (e.g. 10G, 500M)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def human_bytes(n: int | float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def add_cache_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("cache", help="inspect and manage the compiled-kernel cache",
                              description="Inspect and manage the content-addressed kernel cache "
                                          "($DSV4_JIT_CACHE_DIR, read-only layers from $DSV4_JIT_CACHE_LAYERS).")
    sub = p.add_subparsers(dest="cache_cmd", metavar="COMMAND")
    sub.required = True

    def cmd(name: str, help: str) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help, description=help)
        c.add_argument("--json", action="store_true", help="machine-readable output")
        c.add_argument("--cache-dir", default=None, help="writable cache dir (default: $DSV4_JIT_CACHE_DIR "
                                                          "or the user cache dir)")
        return c

    cmd("dir", "print the cache directories")
    ls = cmd("ls", "list cache entries")
    ls.add_argument("--layer", default=None, help="only this layer ('writable', 'read-only' or a root path)")
    cmd("stats", "entries, bytes, hits and misses per layer")
    cmd("verify", "sha256-check every entry; quarantine bad ones (exit 1 if any)")
    pr = cmd("prune", "evict least-recently-used entries until the writable layer fits")
    pr.add_argument("--max-size", required=True, type=str, help="size cap, e.g. 10G, 500M or bytes "
                                                                "(0 empties the cache: asks first, like clear)")
    pr.add_argument("--yes", action="store_true", help="do not ask for confirmation (--max-size 0)")
    cl = cmd("clear", "delete every entry of the writable layer")
    cl.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    ex = cmd("export", "write entries to one compressed bundle (tar.gz, or tar.xz by suffix)")
    ex.add_argument("dest", help="bundle file path or fsspec URL")
    ex.add_argument("--arch", action="append", default=None, help="only this arch (repeatable or comma list)")
    ex.add_argument("--kernel", action="append", default=None, help="only this kernel (repeatable or comma list)")
    ex.add_argument("--coverage", default=None, help="JSON file recorded in the bundle as its coverage")
    im = cmd("import", "verify a bundle, then install its entries")
    im.add_argument("src", help="bundle file path or fsspec URL")
    im.add_argument("--force", action="store_true", help="install even if the toolchain fingerprint differs")
    return p


def _split(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [v for item in values for v in item.replace(",", " ").split()]


# Commands that write the cache: an unwritable dir is their error, not a warning.
_WRITERS = {"import": "import into the cache", "prune": "prune the cache", "clear": "clear the cache"}
_DIR_FIX = "pass --cache-dir DIR or point DSV4_JIT_CACHE_DIR at a writable directory"


def run_cache(args: argparse.Namespace) -> int:
    import warnings
    from .errors import CacheWarning
    from .store import Store
    with warnings.catch_warnings():
        if args.cache_cmd in _WRITERS:
            warnings.simplefilter("ignore", CacheWarning)
        store = Store(args.cache_dir)
    try:
        if args.cache_cmd in _WRITERS:
            store.require_persistent(_WRITERS[args.cache_cmd], _DIR_FIX,
                                     consequence="nothing would be kept" if args.cache_cmd == "import" else "")
        return _COMMANDS[args.cache_cmd](store, args)
    finally:
        store.flush_stats()


def _emit(args: argparse.Namespace, data: Any, human: str) -> None:
    print(json.dumps(data, indent=1, sort_keys=True, default=str) if args.json else human)


def _dir(store, args) -> int:
    layers = [{"root": str(L.root), "kind": "memory-only" if L.memory_only else
               ("writable" if L.writable else "read-only")} for L in store.layers]
    data = {"writable": str(store.writable.root) if store.writable else None, "root": str(store.root),
            "memory_only": store.memory_only, "degraded_reason": store.degraded_reason, "layers": layers}
    human = str(store.writable.root) if store.writable else f"{store.root} (not writable: {store.degraded_reason})"
    if len(layers) > 1 or not store.writable:
        human += "\n" + table(["KIND", "ROOT"], [[L["kind"], L["root"]] for L in layers])
    _emit(args, data, human)
    return 0


def _ls(store, args) -> int:
    rows = []
    for e in store.entries(args.layer):
        rows.append({"key": e.key, "kernel": e.fields.get("kernel"), "arch": e.fields.get("arch"),
                     "files": sorted(e.files), "bytes": e.size, "created": e.manifest.get("created"),
                     "imported": e.imported, "layer": str(e.layer), "read_only": e.read_only_layer,
                     "extra": e.extra})
    human = table(["KEY", "KERNEL", "ARCH", "FILES", "SIZE", "CREATED", "LAYER"],
                  [[r["key"][:16], r["kernel"] or "-", r["arch"] or "-", len(r["files"]), human_bytes(r["bytes"]),
                    time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created"])) if r["created"] else "-",
                    "ro:" + r["layer"] if r["read_only"] else r["layer"]] for r in rows])
    _emit(args, {"entries": rows, "count": len(rows)}, human + f"\n{len(rows)} entries")
    return 0


def _stats(store, args) -> int:
    s = store.stats()
    human = table(["LAYER", "KIND", "ENTRIES", "SIZE", "HITS", "MISSES", "QUARANTINED"],
                  [[L["layer"], L["kind"], L["entries"], human_bytes(L["bytes"]), L["hits"], L["misses"],
                    L["quarantined"]] for L in s["layers"]])
    _emit(args, s, human)
    return 0


def _verify(store, args) -> int:
    r = store.verify()
    human = f"checked {r['checked']} entries ({human_bytes(r['bytes_hashed'])} hashed): {r['ok']} ok, " \
            f"{len(r['bad'])} bad"
    if r["bad"]:
        human += "\n" + table(["KEY", "LAYER", "PROBLEM"], [[b["key"][:16], b["layer"], b["reason"]] for b in r["bad"]])
        human += "\nbad entries were quarantined and will be rebuilt on next use"
    _emit(args, r, human)
    return 1 if r["bad"] else 0


def _confirm(store, args, what: str) -> bool:
    """True to go ahead: --yes, or 'y' typed at a terminal; no terminal and no --yes is an error."""
    if args.yes:
        return True
    if not sys.stdin.isatty():
        raise CacheError(f"refusing to {what} without confirmation; pass --yes")
    answer = input(f"{what[0].upper() + what[1:]}: delete every entry? [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def _prune(store, args) -> int:
    max_size = parse_size(args.max_size)
    if max_size == 0 and not _confirm(store, args, f"prune {store.root} to 0 bytes"):
        _emit(args, {"pruned": False}, "aborted")
        return 1
    r = store.prune(max_size)
    human = (f"evicted {r['evicted_count']} entries, freed {human_bytes(r['freed_bytes'])}; "
             f"now {human_bytes(r.get('bytes_after'))} (cap {human_bytes(r.get('max_size_bytes'))})"
             if r.get("layer") else r.get("note", "nothing to prune"))
    _emit(args, r, human)
    return 0


def _clear(store, args) -> int:
    if not _confirm(store, args, f"clear {store.root}"):
        _emit(args, {"cleared": False}, "aborted")
        return 1
    r = store.clear()
    _emit(args, {"cleared": True, **r},
          f"removed {r['entries_removed']} entries ({human_bytes(r['bytes_removed'])}) from {r['layer']}")
    return 0


def _fingerprint() -> dict:
    from dsv4_jit.toolchain import toolchain_fingerprint
    return dict(toolchain_fingerprint())


def _export(store, args) -> int:
    from .bundle import export_bundle
    coverage = None
    if args.coverage:
        try:
            with open(args.coverage) as f:
                coverage = json.load(f)
        except (OSError, ValueError) as e:
            raise CacheError(f"cannot read coverage file {args.coverage}: {e}") from None
    r = export_bundle(store, args.dest, _fingerprint(), archs=_split(args.arch),
                      kernels=_split(args.kernel), coverage=coverage)
    human = (f"exported {r['entries']} entries ({human_bytes(r['bytes'])}, {human_bytes(r['compressed_bytes'])} "
             f"compressed) to {r['dest']} in {r['seconds']:.2f}s")
    if r["skipped_corrupt"]:
        human += f"\nskipped {len(r['skipped_corrupt'])} corrupt entries (quarantined)"
    _emit(args, r, human)
    return 0


def _import(store, args) -> int:
    from .bundle import import_bundle
    r = import_bundle(store, args.src, _fingerprint(), force=args.force)
    human = (f"imported {r['src']} into {store.root}: {r['installed']} installed, {r['already_present']} "
             f"already present ({human_bytes(r['bytes'])} in {r['seconds']:.2f}s, {r['mb_per_s']} MB/s)")
    for n in r["notes"]:
        human += f"\nnote: {n}"
    _emit(args, r, human)
    if r["persisted"] < r["installed"]:  # the dir went bad mid-way (disk full, remounted read-only)
        raise CacheError(f"only {r['persisted']} of {r['installed']} installed entries were kept: "
                         f"{store.degraded_reason}; {_DIR_FIX}")
    return 0


_COMMANDS = {"dir": _dir, "ls": _ls, "stats": _stats, "verify": _verify, "prune": _prune,
             "clear": _clear, "export": _export, "import": _import}
