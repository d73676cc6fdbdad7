"""Export/import of cache entries as one compressed tar (container builds, air-gapped hosts).

Layout: `manifest.json` first (format, producer fingerprint, archs, entries, blob sizes, coverage),
then `blobs/<sha256>` members in sha order. Import streams the archive once under a byte budget,
spools only listed members into a private staging dir while hashing them, and installs nothing
until every member checked out; then each entry goes through the store's publish path."""
from __future__ import annotations

import gzip
import io
import json
import lzma
import os
import re
import tarfile
import time
import uuid
from pathlib import Path
from typing import IO, Iterable

from ._fs import CHUNK, check_member_name, fsync_dir
from .errors import BundleError, CacheError
from .store import Store

FORMAT_VERSION = 1
BUNDLE_KIND = "dsv4-jit-cache-bundle"
MANIFEST_NAME = "manifest.json"
MAX_MANIFEST_BYTES = 64 << 20
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_GZ_MAGIC = b"\x1f\x8b"
_XZ_MAGIC = b"\xfd7zXZ\x00"


# ------------------------------------------------------------------------ remote bundles (fsspec)
# Any fsspec URL works for export / import / `check --bundle` (s3://, gs://, az://, memory://, sftp://,
# ...), given fsspec (`pip install 'dsv4-jit[remote]'`) and the scheme's implementation (s3fs, gcsfs,
# adlfs, ...). file:// and plain paths never go through fsspec. http(s):// is read-only: through fsspec
# when it and its HTTP implementation (aiohttp) are installed, else through the standard library.
#
# Write side, atomic either way: on an object store an upload becomes visible whole when it completes
# (single PUT or multipart completion) and there is no rename (a "move" is copy + delete), so the bundle
# is streamed straight to its final key and a failed export aborts the upload (nothing appears, an
# existing object is left as it was). On every other fsspec filesystem it is streamed to a hidden temp
# name beside the destination, then moved over it (a rename where the filesystem has one).
OBJECT_STORE_SCHEMES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oci", "oss"})
HTTP_SCHEMES = frozenset({"http", "https"})
REMOTE_HINT = "pip install 'dsv4-jit[remote]'"


def _is_url(s: str) -> bool:
    return "://" in s and not s.startswith("file://")


def _scheme(url: str) -> str:
    return url.split("://", 1)[0].lower()


def _url_fs(url: str, doing: str):
    """(fsspec filesystem, path) for `url`; BundleError naming what to install when it cannot be had."""
    scheme = _scheme(url)
    try:
        import fsspec
    except ImportError:
        raise BundleError(f"{doing} {url} needs fsspec: {REMOTE_HINT}"
                          + ("" if scheme == "memory" else f" and the fsspec implementation for {scheme}://"
                             " (e.g. s3fs for s3://, gcsfs for gs://)")) from None
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as e:
        raise BundleError(f"{doing} {url}: the fsspec implementation for {scheme}:// is not installed "
                          f"({' '.join(str(e).split())})") from None
    except ValueError as e:
        raise BundleError(f"{doing} {url}: fsspec knows no filesystem for {scheme}:// ({e})") from None


class _SafeReader(io.RawIOBase):
    """A remote file as a plain stream: any transport error becomes an OSError naming the URL (the
    import path turns OSError into a one-line BundleError, never a traceback)."""

    def __init__(self, f, src: str) -> None:
        self.f, self.src = f, src

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        try:
            data = self.f.read(len(b))
        except (BundleError, OSError):
            raise
        except Exception as e:  # aiohttp / botocore / google errors are not OSErrors
            raise OSError(f"reading {self.src} failed: {type(e).__name__}: {e}") from None
        b[:len(data)] = data
        return len(data)

    def close(self) -> None:
        try:
            self.f.close()
        except Exception:
            pass
        super().close()


def _open_http_stdlib(src: str) -> tuple[IO[bytes], int | None]:
    import urllib.error
    import urllib.request
    try:
        r = urllib.request.urlopen(urllib.request.Request(src, headers={"User-Agent": "dsv4-jit"}), timeout=60)
    except urllib.error.HTTPError as e:
        if e.code == 404:
            raise BundleError(f"bundle not found: {src} (HTTP 404)") from None
        raise BundleError(f"cannot open bundle {src}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise BundleError(f"cannot open bundle {src}: {getattr(e, 'reason', e)}") from None
    length = r.headers.get("Content-Length")
    return io.BufferedReader(_SafeReader(r, src), CHUNK), int(length) if length and length.isdigit() else None


def _open_remote(src: str) -> tuple[IO[bytes], int | None]:
    """Open a bundle URL for one sequential read (streamed: never the whole bundle in memory)."""
    scheme = _scheme(src)
    if scheme in HTTP_SCHEMES:
        try:
            import fsspec
            fs, path = fsspec.core.url_to_fs(src)
        except (ImportError, ValueError):   # no fsspec, or no aiohttp: the standard library reads it
            return _open_http_stdlib(src)
        kw = {"block_size": 0}              # a stream: no range requests, any static file server works
    else:
        fs, path = _url_fs(src, "importing from")
        kw = {}
    try:
        f = fs.open(path, "rb", **kw)
    except FileNotFoundError:
        raise BundleError(f"bundle not found: {src}") from None
    except BundleError:
        raise
    except Exception as e:
        raise BundleError(f"cannot open bundle {src}: {type(e).__name__}: {' '.join(str(e).split())}") from None
    size = getattr(f, "size", None)
    return io.BufferedReader(_SafeReader(f, src), CHUNK), size if isinstance(size, int) else None


class _CountingWriter:
    def __init__(self, f) -> None:
        self.f, self.n = f, 0

    def write(self, b) -> int:
        self.f.write(b)
        self.n += len(b)
        return len(b)

    def flush(self) -> None:
        flush = getattr(self.f, "flush", None)
        if flush is not None:
            flush()


def _export_remote(dest: str, manifest_raw: bytes, blobs: dict[str, tuple[int, Path]], xz: bool) -> int:
    """Stream the bundle to an fsspec URL, atomically (see above). Returns the bytes written."""
    scheme = _scheme(dest)
    if scheme in HTTP_SCHEMES:
        raise BundleError(f"cannot export to {dest}: http(s) URLs are read-only here; export to a file or an "
                          "object store (s3://, gs://) and serve that")
    fs, path = _url_fs(dest, "exporting to")
    direct = scheme in OBJECT_STORE_SCHEMES
    parent, _, name = path.rstrip("/").rpartition("/")
    target = path if direct else f"{parent}/.{name}.{uuid.uuid4().hex[:8]}.tmp" if parent else \
        f".{name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        if parent and not direct:
            fs.makedirs(parent, exist_ok=True)
        f = fs.open(target, "wb")
    except BundleError:
        raise
    except Exception as e:
        raise BundleError(f"cannot write {dest}: {type(e).__name__}: {' '.join(str(e).split())}") from None
    out = _CountingWriter(f)
    try:
        _write_tar(out, manifest_raw, blobs, xz)
    except BaseException:
        discard = getattr(f, "discard", None)
        try:
            if discard is not None:
                discard()                 # object stores: abort the upload, nothing becomes visible
            f.closed = True               # and never close(): close() would commit the upload
        except Exception:
            pass
        if not direct:
            try:
                fs.rm(target)
            except Exception:
                pass
        raise
    try:
        f.close()                          # object stores: the upload completes here, whole
        if not direct:
            fs.mv(target, path)
    except Exception as e:
        if not direct:
            try:
                fs.rm(target)
            except Exception:
                pass
        raise BundleError(f"writing {dest} failed: {type(e).__name__}: {' '.join(str(e).split())}") from None
    return out.n


# ------------------------------------------------------------------------ export


def _local(s: str) -> Path:
    return Path(s[len("file://"):] if s.startswith("file://") else s).expanduser()


def _norm_arch(a: str) -> str:
    try:
        from dsv4_jit.arch import get_profile
        return get_profile(a).name
    except Exception:
        return a


def export_bundle(store: Store, dest: str | os.PathLike, fingerprint: dict, *,
                  archs: Iterable[str] | None = None, kernels: Iterable[str] | None = None,
                  keys: Iterable[str] | None = None, coverage: object = None) -> dict:
    """Write the store's entries (first layer wins per key; filtered by fields['arch'] /
    fields['kernel'] / an explicit key set) to `dest` (local path, written tmp + rename; or an fsspec URL)."""
    t0 = time.monotonic()
    dest = os.fspath(dest)
    want_archs = {_norm_arch(a) for a in archs} if archs else None
    want_kernels = set(kernels) if kernels else None
    want_keys = set(keys) if keys is not None else None
    chosen: dict[str, object] = {}
    for e in store.entries():
        if e.key in chosen:
            continue
        if want_keys is not None and e.key not in want_keys:
            continue
        if want_archs is not None and _norm_arch(str(e.fields.get("arch"))) not in want_archs:
            continue
        if want_kernels is not None and e.fields.get("kernel") not in want_kernels:
            continue
        chosen[e.key] = e
    # Hash everything before writing: a damaged entry is quarantined and left out, not shipped.
    vr = store.verify(list(chosen)) if chosen else {"bad": []}
    bad = {b["key"] for b in vr["bad"]}
    entries = [chosen[k] for k in sorted(chosen) if k not in bad]
    blobs: dict[str, tuple[int, Path]] = {}
    recs = []
    for e in entries:
        for name, info in e.manifest["files"].items():
            blobs.setdefault(info["sha256"], (info["size"], e.files[name]))
        recs.append({"key": e.key, "fields": e.fields, "files": e.manifest["files"], "extra": e.extra,
                     "created": e.manifest.get("created"), "producer": e.manifest.get("producer", {})})
    arch_list = sorted(want_archs) if want_archs else sorted({str(r["fields"].get("arch")) for r in recs
                                                              if r["fields"].get("arch") is not None})
    manifest = {"format_version": FORMAT_VERSION, "kind": BUNDLE_KIND, "created": time.time(),
                "producer": fingerprint, "archs": arch_list, "entries": recs,
                "blobs": {sha: size for sha, (size, _) in sorted(blobs.items())},
                "total_bytes": sum(size for size, _ in blobs.values()), "coverage": coverage}
    raw = json.dumps(manifest, sort_keys=True, indent=1).encode()
    xz = dest.endswith((".xz", ".txz"))

    if _is_url(dest):
        size = _export_remote(dest, raw, blobs, xz)
    else:
        out = _local(dest)
        check_export_dest(out)
        tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            with open(tmp, "wb") as raw_f:
                _write_tar(raw_f, raw, blobs, xz)
                raw_f.flush()
                os.fsync(raw_f.fileno())
            os.replace(tmp, out)
            fsync_dir(out.parent)
        except BaseException as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            if isinstance(e, OSError) and not isinstance(e, CacheError):
                where = f" ({e.filename})" if e.filename and os.fspath(e.filename) != str(tmp) else ""
                raise BundleError(f"cannot write bundle {out}: {e.strerror or e}{where}") from None
            raise
        size = out.stat().st_size
    secs = time.monotonic() - t0
    return {"dest": dest, "entries": len(recs), "blobs": len(blobs), "bytes": manifest["total_bytes"],
            "compressed_bytes": size, "archs": arch_list, "skipped_corrupt": sorted(bad),
            "seconds": round(secs, 4)}


def check_export_dest(dest: str | os.PathLike) -> None:
    """BundleError now if a local `dest` cannot be written (missing or read-only dir, a directory), so a
    warmup fails before compiling, not after. URLs are checked when written."""
    dest = os.fspath(dest)
    if _is_url(dest):
        return
    out = _local(dest)
    if out.is_dir():
        raise BundleError(f"export destination {out} is a directory; give a file name such as "
                          f"{out / 'dsv4-jit-cache.tar.gz'}")
    probe = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.probe")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(probe)
    except OSError as e:
        raise BundleError(f"cannot write bundle {out}: {e.strerror or e}") from None


def _write_tar(raw_f, manifest_raw: bytes, blobs: dict[str, tuple[int, Path]], xz: bool) -> None:
    """Stream the compressed tar into the writable file object `raw_f` (left open), one blob at a time."""
    # mtime=0 and fixed member metadata: the same entries give the same bundle bytes.
    comp: IO[bytes] = (lzma.open(raw_f, "wb", preset=6) if xz
                       else gzip.GzipFile(fileobj=raw_f, mode="wb", compresslevel=6, mtime=0))
    with comp, tarfile.open(fileobj=comp, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_info(MANIFEST_NAME, len(manifest_raw)), io.BytesIO(manifest_raw))
        for sha, (size, src) in sorted(blobs.items()):
            with open(src, "rb") as f:
                hf = _HashingReader(f)
                tar.addfile(_info(f"blobs/{sha}", size), hf)
            if hf.hexdigest() != sha or hf.n != size:
                raise CacheError(f"blob {src} changed while exporting (sha256/size mismatch); "
                                 "run `dsv4-jit cache verify` and retry")


def _info(name: str, size: int) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mode, ti.mtime, ti.type = size, 0o444, 0, tarfile.REGTYPE
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    return ti


class _HashingReader:
    def __init__(self, f: IO[bytes]) -> None:
        import hashlib
        self.f, self.h, self.n = f, hashlib.sha256(), 0

    def read(self, n: int = -1) -> bytes:
        b = self.f.read(n)
        self.h.update(b)
        self.n += len(b)
        return b

    def hexdigest(self) -> str:
        return self.h.hexdigest()


# ------------------------------------------------------------------------ import
class _Budget(io.RawIOBase):
    """Counts decompressed bytes and refuses to go past a limit (decompression-bomb guard)."""

    def __init__(self, inner: IO[bytes], limit: int) -> None:
        self.inner, self.limit, self.used = inner, limit, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        want = min(len(b), self.limit - self.used + 1)
        data = self.inner.read(want)
        self.used += len(data)
        if self.used > self.limit:
            raise BundleError(f"bundle expands past {self.limit} bytes, far more than its manifest "
                              "declares (decompression bomb or padded archive); refusing it")
        b[:len(data)] = data
        return len(data)


def _open_src(src: str) -> tuple[IO[bytes], int | None]:
    if _is_url(src):
        return _open_remote(src)
    p = _local(src)
    try:
        return open(p, "rb"), p.stat().st_size
    except FileNotFoundError:
        raise BundleError(f"bundle not found: {p}") from None
    except OSError as e:
        raise BundleError(f"cannot read bundle {p}: {e}") from None


def _decompressor(f: IO[bytes]) -> IO[bytes]:
    head = f.read(6)
    rest = _Prefixed(head, f)
    if head.startswith(_GZ_MAGIC):
        return gzip.GzipFile(fileobj=rest, mode="rb")  # type: ignore[arg-type]
    if head.startswith(_XZ_MAGIC):
        return lzma.open(rest, "rb")  # type: ignore[arg-type]
    raise BundleError("not a dsv4-jit bundle: expected a gzip- or xz-compressed tar")


class _Prefixed(io.RawIOBase):
    def __init__(self, head: bytes, f: IO[bytes]) -> None:
        self.head, self.f = head, f

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        if self.head:
            n = min(len(b), len(self.head))
            b[:n], self.head = self.head[:n], self.head[n:]
            return n
        data = self.f.read(len(b))
        b[:len(data)] = data
        return len(data)


def fingerprint_diff(bundle: dict, here: dict) -> list[str]:
    return [f"{k}: bundle {bundle.get(k)!r} vs here {here.get(k)!r}"
            for k in sorted(set(bundle) | set(here)) if bundle.get(k) != here.get(k)]


def _validate_manifest(m: object) -> dict:
    if not isinstance(m, dict):
        raise BundleError("bundle manifest.json is not a JSON object")
    if m.get("format_version") != FORMAT_VERSION:
        raise BundleError(f"unknown bundle format_version {m.get('format_version')!r}; this dsv4-jit "
                          f"reads format {FORMAT_VERSION} (upgrade dsv4-jit or re-export the bundle)")
    if m.get("kind") != BUNDLE_KIND:
        raise BundleError(f"manifest.json kind is {m.get('kind')!r}, not {BUNDLE_KIND!r}")
    blobs, entries = m.get("blobs"), m.get("entries")
    if not isinstance(blobs, dict) or not isinstance(entries, list) or not isinstance(m.get("producer"), dict):
        raise BundleError("bundle manifest lacks producer/entries/blobs")
    for sha, size in blobs.items():
        if not _HEX64.match(str(sha)) or not isinstance(size, int) or size < 0:
            raise BundleError(f"bundle manifest has a bad blob record {sha!r}: {size!r}")
    used: set[str] = set()
    keys: set[str] = set()
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or not _HEX64.match(str(e.get("key"))):
            raise BundleError(f"bundle entry #{i} has no valid key")
        if e["key"] in keys:
            raise BundleError(f"bundle lists key {e['key']} twice")
        keys.add(e["key"])
        files = e.get("files")
        if not isinstance(e.get("fields"), dict) or not isinstance(files, dict) or not files:
            raise BundleError(f"bundle entry {e['key'][:16]}... lacks fields or files")
        if not isinstance(e.get("extra", {}) or {}, dict):
            raise BundleError(f"bundle entry {e['key'][:16]}... has non-dict extra")
        for name, info in files.items():
            why = check_member_name(name)
            if why:
                raise BundleError(f"bundle entry {e['key'][:16]}... has unsafe file name {name!r}: {why}")
            if (not isinstance(info, dict) or info.get("sha256") not in blobs
                    or blobs[info["sha256"]] != info.get("size")):
                raise BundleError(f"bundle entry {e['key'][:16]}... file {name!r} does not match a "
                                  "listed blob (sha256/size)")
            used.add(info["sha256"])
    unused = set(blobs) - used
    if unused:
        raise BundleError(f"bundle manifest lists {len(unused)} blob(s) no entry uses, e.g. {min(unused)}")
    return m


def _member_problem(ti: tarfile.TarInfo) -> str | None:
    why = check_member_name(ti.name)
    if why:
        return why
    if ti.issym() or ti.islnk():
        return f"is a {'symbolic' if ti.issym() else 'hard'} link"
    if ti.ischr() or ti.isblk() or ti.isfifo() or ti.isdev():
        return "is a device or fifo"
    if ti.isdir():
        return "is a directory"
    if not ti.isreg() or ti.issparse():
        return "is not a regular file"
    return None


def import_bundle(store: Store, src: str | os.PathLike, expected_fingerprint: dict, *,
                  force: bool = False) -> dict:
    """Check the whole bundle, then install its entries through the store's publish path.
    Idempotent; existing entries are kept. Raises BundleError with nothing installed on any problem."""
    t0 = time.monotonic()
    src = os.fspath(src)
    f, compressed = _open_src(src)
    notes: list[str] = []
    try:
        with store.staging_dir() as (layer, spool):
            m, diff = _stream_and_check(f, spool, expected_fingerprint, force, src)
            t_checked = time.monotonic()
            if diff:
                notes.append("fingerprint differs (" + "; ".join(diff) + "): installed anyway (--force); "
                             "these keys were computed with the bundle's toolchain, so they will not "
                             "match kernels compiled here and are only used by that toolchain")
            origin = {"bundle_producer": m["producer"], "imported_at": time.time(), "forced": bool(diff)}
            try:
                installed, present = _install(store, layer, spool, m, origin)
            except OSError as e:
                raise CacheError(f"importing {src} into {layer.root} failed part-way ({e}); entries "
                                 "installed so far are whole, the rest are missing: free space or fix "
                                 "permissions and import again (it is idempotent)") from None
    finally:
        f.close()
    secs = time.monotonic() - t0
    total = int(sum(m["blobs"].values()))
    persisted = 0 if layer.memory_only else installed
    if layer.memory_only:
        notes.append("no writable cache dir: entries live in a temp dir for this process only")
    return {"src": src, "format_version": m["format_version"], "entries": len(m["entries"]),
            "installed": installed, "persisted": persisted, "already_present": present, "blobs": len(m["blobs"]),
            "bytes": total, "compressed_bytes": compressed, "archs": m.get("archs", []),
            "fingerprint_match": not diff, "fingerprint_diff": diff, "forced": bool(force and diff),
            "coverage": m.get("coverage"), "check_seconds": round(t_checked - t0, 4),
            "seconds": round(secs, 4), "mb_per_s": round(total / 1e6 / secs, 2) if secs > 0 else None,
            "notes": notes}


def _stream_and_check(f: IO[bytes], spool: Path, expected: dict, force: bool,
                      src: str) -> tuple[dict, list[str]]:
    """One pass over the archive: manifest first, then each blob hashed into `spool/<sha>`."""
    budget = _Budget(_decompressor(f), MAX_MANIFEST_BYTES + (1 << 20))
    try:
        with tarfile.open(fileobj=io.BufferedReader(budget, CHUNK), mode="r|") as tar:  # type: ignore[arg-type]
            m = _read_manifest_member(tar, src)
            diff = fingerprint_diff(m["producer"], expected)
            if diff and not force:
                raise BundleError(f"{src} was built with a different toolchain: {'; '.join(diff)}. Its keys "
                                  "would never match kernels compiled here; pass --force (force=True) to "
                                  "install it anyway")
            declared = m["blobs"]
            # Tar overhead: header + pax header + padding per member, end blocks and record padding.
            budget.limit = budget.used + sum(declared.values()) + 3072 * (len(declared) + 2) + (1 << 20) \
                + sum(declared.values()) // 100
            seen: set[str] = {MANIFEST_NAME}
            got: set[str] = set()
            # tar.next(), not `for ti in tar`: iteration would replay the manifest member.
            while (ti := tar.next()) is not None:
                if ti.name in seen:
                    raise BundleError(f"{src}: duplicate member {ti.name!r}")
                seen.add(ti.name)
                why = _member_problem(ti)
                if why:
                    raise BundleError(f"{src}: member {ti.name!r} {why}; refusing the bundle")
                sha = ti.name[len("blobs/"):] if ti.name.startswith("blobs/") else ""
                if sha not in declared:
                    raise BundleError(f"{src}: member {ti.name!r} is not listed in the manifest")
                if ti.size != declared[sha]:
                    raise BundleError(f"{src}: member {ti.name!r} is {ti.size} bytes, manifest says {declared[sha]}")
                _spool(tar, ti, spool / sha, sha, src)
                got.add(sha)
            missing = set(declared) - got
            if missing:
                raise BundleError(f"{src}: {len(missing)} blob(s) listed in the manifest are missing, "
                                  f"e.g. blobs/{min(missing)}")
        # Drain to the end so trailing junk is budgeted and the gzip CRC is checked.
        while budget.read(CHUNK):
            pass
    except BundleError:
        raise
    except (tarfile.TarError, EOFError, OSError, lzma.LZMAError, ValueError) as e:
        raise BundleError(f"{src}: corrupt or truncated bundle ({type(e).__name__}: {e})") from None
    return m, diff


def _read_manifest_member(tar: tarfile.TarFile, src: str) -> dict:
    first = tar.next()
    if first is None or first.name != MANIFEST_NAME:
        raise BundleError(f"{src}: first member must be {MANIFEST_NAME}, found "
                          f"{first.name if first else 'an empty archive'!r}")
    why = _member_problem(first)
    if why or first.size > MAX_MANIFEST_BYTES:
        raise BundleError(f"{src}: {MANIFEST_NAME} {why or 'is too large'}")
    try:
        return _validate_manifest(json.loads(tar.extractfile(first).read()))  # type: ignore[union-attr]
    except ValueError as e:
        if isinstance(e, BundleError):
            raise
        raise BundleError(f"{src}: manifest.json is not valid JSON ({e})") from None


def read_manifest(src: str | os.PathLike) -> dict:
    """A bundle's validated manifest (entries, producer, archs, coverage), from a path or URL. Reads
    only the head of the archive (the manifest is its first member), so checking a remote bundle's
    coverage does not download it. Blobs are not checked here; import checks everything."""
    src = os.fspath(src)
    f, _ = _open_src(src)
    try:
        budget = _Budget(_decompressor(f), MAX_MANIFEST_BYTES + (1 << 20))
        with tarfile.open(fileobj=io.BufferedReader(budget, CHUNK), mode="r|") as tar:  # type: ignore[arg-type]
            return _read_manifest_member(tar, src)
    except BundleError:
        raise
    except (tarfile.TarError, EOFError, OSError, lzma.LZMAError, ValueError) as e:
        raise BundleError(f"{src}: corrupt or truncated bundle ({type(e).__name__}: {e})") from None
    finally:
        f.close()


def _spool(tar: tarfile.TarFile, ti: tarfile.TarInfo, dst: Path, sha: str, src: str) -> None:
    import hashlib
    h = hashlib.sha256()
    n = 0
    r = tar.extractfile(ti)
    if r is None:
        raise BundleError(f"{src}: member {ti.name!r} has no data")
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        while True:
            b = r.read(CHUNK)
            if not b:
                break
            n += len(b)
            if n > ti.size:
                raise BundleError(f"{src}: member {ti.name!r} is longer than its header says")
            h.update(b)
            view = memoryview(b)
            while view:
                view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    if n != ti.size or h.hexdigest() != sha:
        raise BundleError(f"{src}: member {ti.name!r} fails its sha256/size check (corrupt or tampered bundle)")


def _install(store: Store, layer, spool: Path, m: dict, origin: dict) -> tuple[int, int]:
    todo = [e for e in m["entries"]
            if not any(os.path.exists(L.manifest_path(e["key"])) for L in store.layers)]
    # Every blob first (one fsync per blob dir), then manifests (one fsync per manifest dir at the end).
    store._install_blobs(layer, ((n, spool / i["sha256"], i["sha256"], i["size"])
                                 for e in todo for n, i in e["files"].items()), spool)
    dirs: set[str] = set()
    for e in todo:
        files = {name: (spool / info["sha256"], info["sha256"], info["size"])
                 for name, info in e["files"].items()}
        created = e.get("created") if isinstance(e.get("created"), (int, float)) else None
        producer = e.get("producer") if isinstance(e.get("producer"), dict) else m["producer"]
        store._publish_files(layer, e["key"], e["fields"], files, e.get("extra") or {}, scratch=spool,
                             producer=producer, created=created, origin=origin, blobs_ready=True,
                             deferred_dirs=dirs)
    for d in dirs:
        fsync_dir(d)
    return len(todo), len(m["entries"]) - len(todo)
