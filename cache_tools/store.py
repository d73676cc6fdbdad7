"""The artifact store: a writable layer over read-only layers, Bazel-style (blobs + action index).

Publishing stages an entry privately, links blobs into place, and writes the manifest last, so a
reader sees a whole entry or nothing (triton#11319). A per-key flock makes N processes build once
(DeepGEMM#301); without locks, first manifest wins. Corrupt entries are quarantined and reported
as misses, never loaded (vllm#41871). EROFS/EACCES/ENOSPC degrade to a private temp dir."""
from __future__ import annotations

import atexit
import errno
import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
import threading
import time
import uuid
import warnings
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator

import filelock

from . import maintenance
from ._fs import (UNWRITABLE_ERRNOS, check_member_name, fsync_dir, hash_and_fsync, host_tag,
                  pid_alive, read_small, sha256_file, staging_name, write_file_durable)
from .errors import CacheError, CacheSecurityError, CacheWarning
from .keys import check_key, check_key_fields
from .layer import MANIFEST_FORMAT, SUBDIRS, Layer, ManifestError, encode_manifest, parse_manifest
from .security import check_dir, shared_opt_in

log = logging.getLogger("dsv4_jit.cache")

CACHE_DIR_ENV = "DSV4_JIT_CACHE_DIR"
LAYERS_ENV = "DSV4_JIT_CACHE_LAYERS"
# Test hook: sleep this many seconds after blobs are in place and before the manifest is written.
PAUSE_BEFORE_MANIFEST_ENV = "DSV4_JIT_CACHE_TEST_PAUSE_BEFORE_MANIFEST"
_NO_LINK_ERRNOS = frozenset({errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOSYS,
                             getattr(errno, "ENOTSUP", errno.EOPNOTSUPP), errno.EOPNOTSUPP})
_BUILD_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
_LAYER_IS = (f"a layer is a directory laid out as {CACHE_DIR_ENV} holds it (v1/ac/ manifests over v1/blobs/), "
             "such as a cache dir baked into an image")

# Process-wide memos (several Store objects may point at the same layers).
_warned: set[str] = set()
_verified: set[tuple[str, str, str]] = set()   # (layer root, key, manifest sha256) hashed OK
_bad: dict[tuple[str, str], str] = {}           # (layer root, key) -> manifest sha256 judged corrupt
_live_stores: "weakref.WeakSet[Store]" = weakref.WeakSet()
_temp_dirs: list[str] = []


def _warn_once(tag: str, msg: str) -> None:
    if tag in _warned:
        log.debug(msg)
        return
    _warned.add(tag)
    warnings.warn(msg, CacheWarning, stacklevel=3)


def _errname(e: OSError) -> str:
    name = errno.errorcode.get(e.errno or 0, "OSError")
    return f"{name}: {e.strerror or e}"


def _digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def default_cache_dir() -> Path:
    env = os.environ.get(CACHE_DIR_ENV)
    if env:
        return Path(env).expanduser()
    import platformdirs
    return Path(platformdirs.user_cache_dir("dsv4-jit"))


def env_layers() -> list[Path]:
    raw = os.environ.get(LAYERS_ENV, "")
    return [Path(p).expanduser() for p in raw.split(os.pathsep) if p.strip()]


class Entry:
    """A whole, size-checked cache entry. `files` maps artifact names to absolute blob paths."""
    __slots__ = ("key", "layer", "manifest", "read_only_layer", "_paths", "_files")

    def __init__(self, key: str, layer: Path, manifest: dict, paths: dict[str, str],
                 read_only_layer: bool) -> None:
        self.key, self.layer, self.manifest = key, layer, manifest
        self.read_only_layer = read_only_layer
        self._paths = paths
        self._files: dict[str, Path] | None = None

    @property
    def files(self) -> dict[str, Path]:
        # Built on first use: Path objects cost more than the rest of a warm lookup.
        if self._files is None:
            self._files = {n: Path(p) for n, p in self._paths.items()}
        return self._files

    @property
    def fields(self) -> dict:
        return self.manifest.get("fields", {})

    @property
    def extra(self) -> dict:
        return self.manifest.get("extra") or {}

    @property
    def size(self) -> int:
        return sum(i["size"] for i in self.manifest["files"].values())

    @property
    def imported(self) -> bool:
        return bool(self.manifest.get("imported"))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Entry) and (self.key, self.layer, self.manifest, self._paths)
                == (other.key, other.layer, other.manifest, other._paths))

    def __hash__(self) -> int:
        return hash((self.key, str(self.layer)))

    def __repr__(self) -> str:
        return f"Entry(key={self.key[:16]}..., layer={str(self.layer)!r}, files={sorted(self._paths)})"


def _check_extra(extra: object) -> dict:
    if extra is None:
        return {}
    if not isinstance(extra, dict):
        raise CacheError(f"build() must return a dict of extra metadata or None, got {type(extra).__name__}")
    try:
        json.dumps(extra, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise CacheError(f"build() returned extra metadata that is not JSON: {e}") from None
    return extra


def _rmtree(path: Path | None) -> None:
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def _best_effort_lock(path: Path, timeout: float) -> Iterator[None]:
    """Hold a file lock when one can be had; otherwise run unlocked (callers stay correct without it)."""
    lock = None
    try:
        lock = filelock.FileLock(str(path), timeout=timeout)
        lock.acquire()
    except Exception:
        lock = None
    try:
        yield
    finally:
        if lock is not None:
            try:
                lock.release()
            except Exception:
                pass


class Store:
    """Content-addressed artifact cache. See module docstring; all public methods are process- and
    thread-safe. `root` defaults to $DSV4_JIT_CACHE_DIR or the platform user cache dir; `layers`
    (read-only, searched after it) default to $DSV4_JIT_CACHE_LAYERS."""

    def __init__(self, root: str | os.PathLike | None = None, *,
                 layers: Iterable[str | os.PathLike] | None = None,
                 allow_shared: bool | None = None, producer: dict | None = None,
                 lock_timeout: float = 3600.0) -> None:
        from dsv4_jit import __version__
        self.allow_shared = shared_opt_in(allow_shared)
        self.producer = {"dsv4_jit": __version__, "cache_layout": "v1", **(producer or {})}
        self.lock_timeout = lock_timeout
        self.root = Path(root).expanduser().absolute() if root else default_cache_dir().absolute()
        self.writable: Layer | None = None
        self.read_only: list[Layer] = []
        self.degraded_reason: str | None = None
        self._fallback: Layer | None = None
        self._counts: dict[str, list[int]] = {}   # layer label -> [hits, misses, quarantined]
        self._touched: set[str] = set()
        self._key_locks: dict[str, threading.Lock] = {}
        self._mutex = threading.Lock()
        self._open_writable()
        for p in (env_layers() if layers is None else layers):
            self._add_read_only(Path(p).expanduser().absolute())
        self._search = self._search_order()
        if self.writable is not None:
            maintenance.clean_stale_staging(self.writable.dir("staging"))
        _live_stores.add(self)

    # ----------------------------------------------------------------- opening
    def _open_writable(self) -> None:
        root = self.root
        try:
            check_dir(root, writable_layer=True, allow_shared=self.allow_shared)
        except CacheSecurityError:
            st = os.stat(root)
            if st.st_uid != 0 or st.st_mode & 0o022:
                raise
            # Root's own private dir (an image-baked cache): we cannot write it anyway, read it only.
            self._degrade(f"cache dir {root} belongs to root")
            self._use_read_only_root()
            return
        layer = Layer(root, writable=True)
        try:
            existed = root.exists()
            os.makedirs(root, mode=0o700, exist_ok=True)  # os.*, not Path.*: one code path to fail
            if not existed:
                os.chmod(root, 0o700)  # mkdir's mode is filtered by umask; say it outright
            for sub in SUBDIRS:
                os.makedirs(layer.dir(sub), mode=0o700, exist_ok=True)
            for d in (root, layer.v, layer.dir("ac"), layer.dir("blobs")):
                check_dir(d, writable_layer=True, allow_shared=self.allow_shared)
            probe = layer.dir("staging") / f".probe-{staging_name()}"
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            os.unlink(probe)
        except OSError as e:
            self._degrade(f"cache dir {root} is not writable ({_errname(e)})")
            self._use_read_only_root()
            return
        self.writable = layer

    def _use_read_only_root(self) -> None:
        """Still serve what is in an unwritable root (e.g. a cache baked into an image)."""
        ro = Layer(self.root, writable=False)
        try:
            usable = ro.has_layout()
        except OSError:
            usable = False
        if usable:
            for d in (ro.root, ro.v, ro.dir("ac"), ro.dir("blobs")):
                check_dir(d, writable_layer=False, allow_shared=self.allow_shared)
            self.read_only.append(ro)

    def _add_read_only(self, root: Path) -> None:
        if root == self.root or any(r.root == root for r in self.read_only):
            return
        layer = Layer(root, writable=False)
        if not layer.has_layout():
            if (root / "manifest.json").is_file() and (root / "blobs").is_dir():
                # Bundle blobs are stored by hash alone (no .so name), so they cannot be loaded in place.
                raise CacheError(f"read-only layer {root} is an unpacked bundle, not a cache dir: {_LAYER_IS} "
                                 f"(`dsv4-jit cache import BUNDLE.tar.gz --cache-dir DIR` makes one; list DIR "
                                 f"in {LAYERS_ENV} instead)")
            _warn_once(f"missing-layer:{root}",
                       f"dsv4-jit cache: read-only layer {root} is not a cache dir, ignoring it: {_LAYER_IS} "
                       f"(e.g. one filled by `dsv4-jit cache import BUNDLE.tar.gz --cache-dir DIR`)")
            return
        for d in (root, layer.v, layer.dir("ac"), layer.dir("blobs")):
            check_dir(d, writable_layer=False, allow_shared=self.allow_shared)
        self.read_only.append(layer)

    def _search_order(self) -> list[Layer]:
        first = [self.writable] if self.writable is not None else []
        fb = [self._fallback] if self._fallback is not None else []
        return first + fb + self.read_only

    def _degrade(self, reason: str) -> None:
        self.degraded_reason = self.degraded_reason or reason
        _warn_once("memory-only",
                   f"dsv4-jit cache: {reason}; continuing without a persistent cache: kernels built "
                   f"now live in a private temp dir for this process only and are rebuilt next run. "
                   f"Point {CACHE_DIR_ENV} at a writable dir to keep them.")

    def _fallback_layer(self) -> Layer:
        with self._mutex:
            if self._fallback is None:
                _clean_dead_temp_layers()
                try:
                    d = tempfile.mkdtemp(prefix=f"dsv4-jit-mem-{host_tag()}-{os.getpid()}-")
                    layer = Layer(Path(d), writable=True, memory_only=True)
                    for sub in SUBDIRS:
                        os.makedirs(layer.dir(sub), mode=0o700, exist_ok=True)
                except OSError as e:
                    raise CacheError(f"no writable cache dir and no usable temp dir either "
                                     f"({_errname(e)}); set {CACHE_DIR_ENV} or TMPDIR to a writable dir") from None
                _temp_dirs.append(d)
                self._fallback = layer
                self._search = self._search_order()
            return self._fallback

    @property
    def memory_only(self) -> bool:
        """True when new entries cannot be persisted (no writable layer or it failed)."""
        return self.writable is None or self.degraded_reason is not None

    @property
    def layers(self) -> list[Layer]:
        return list(self._search)

    # ----------------------------------------------------------------- reading
    def lookup(self, key: str) -> Entry | None:
        """The entry for `key` from the first layer that has it whole, else None (never raises on
        a damaged cache: damaged entries are quarantined and count as misses)."""
        check_key(key)
        return self._lookup(key, count=True)

    def peek(self, key: str) -> Entry | None:
        """`lookup` without counting a hit or miss: for probes (planning, `check`), not uses."""
        check_key(key)
        return self._lookup(key, count=False)

    def contains(self, key: str) -> bool:
        return self.peek(key) is not None

    def require_persistent(self, doing: str, fix: str = "", *, consequence: str = "nothing would be kept") -> None:
        """CacheError unless new entries would outlive this process: a command whose purpose is to fill
        (or change) the cache must fail, not fill a temp dir that vanishes at exit."""
        if not self.memory_only:
            return
        reason = self.degraded_reason or f"cache dir {self.root} is not writable"
        raise CacheError(f"cannot {doing}: {reason}{', so ' + consequence if consequence else ''}; "
                         f"{fix or f'point {CACHE_DIR_ENV} at a writable directory'}")

    def lookup_many(self, keys: Iterable[str]) -> dict[str, Entry | None]:
        return {k: self.lookup(k) for k in keys}

    def _lookup(self, key: str, *, count: bool) -> Entry | None:
        for layer in self._search:
            e = self._lookup_in(layer, key)
            if e is not None:
                if count:
                    self._count(e)
                return e
        if count:
            self._count(None)
        return None

    def _count(self, found: Entry | None) -> None:
        """A miss in each layer searched before the one that served `found` (a hit there); misses in all
        of them when nothing did."""
        for layer in self._search:
            c = self._counts.setdefault(layer.label, [0, 0, 0])
            if found is not None and layer.root == found.layer:
                c[0] += 1
                return
            c[1] += 1

    def _lookup_in(self, layer: Layer, key: str, *, verify_hash: bool = True) -> Entry | None:
        # Warm path: one manifest read, one stat per file, at most one utime. No hashing.
        try:
            raw = read_small(layer.manifest_path(key))
        except FileNotFoundError:
            return None
        except OSError as e:
            log.debug("cache: cannot read manifest for %s in %s: %s", key, layer.root, e)
            return None
        if _bad and _bad.get((str(layer.root), key)) == _digest(raw):
            return None
        try:
            m = parse_manifest(raw, key)
            files: dict[str, str] = {}
            for name, info in m["files"].items():
                p = layer.blob_path(info["sha256"], name)
                size = os.stat(p).st_size
                if size != info["size"]:
                    self._quarantine(layer, key, raw, f"{name}: blob is {size} bytes, manifest says "
                                     f"{info['size']}", [p])
                    return None
                files[name] = p
        except ManifestError as e:
            self._quarantine(layer, key, raw, str(e))
            return None
        except FileNotFoundError as e:
            self._quarantine(layer, key, raw, f"blob missing: {e.filename}")
            return None
        except OSError as e:
            log.debug("cache: cannot stat blobs of %s in %s: %s", key, layer.root, e)
            return None
        if (verify_hash and (not layer.writable or (m.get("imported") and not m.get("verified")))
                and not self._is_verified(layer, key, raw)):
            bad = _hash_mismatches(m, files)
            if bad:
                self._quarantine(layer, key, raw, "; ".join(r for _, r in bad), [p for p, _ in bad])
                return None
            self._mark_verified(layer, key, raw, m)
        if layer.writable and key not in self._touched:
            self._touch(layer, key)
        return Entry(key, layer.root, m, files, not layer.writable)

    def _is_verified(self, layer: Layer, key: str, raw: bytes) -> bool:
        return (str(layer.root), key, _digest(raw)) in _verified

    def _mark_verified(self, layer: Layer, key: str, raw: bytes, m: dict) -> None:
        """Remember a successful hash check: in-process, and for an imported entry in a writable
        layer by rewriting its manifest with `verified` set, so later processes skip the hashing
        without an extra marker read per lookup."""
        _verified.add((str(layer.root), key, _digest(raw)))
        if not layer.writable or layer.memory_only or not m.get("imported") or m.get("verified"):
            return
        new = encode_manifest({**m, "verified": time.time()})
        tmp = layer.dir("staging") / f".verified-{uuid.uuid4().hex}"
        mpath = layer.manifest_path(key)
        try:
            write_file_durable(tmp, new, 0o444)
            if read_small(mpath) == raw:  # only replace the manifest we checked
                os.replace(tmp, mpath)
                _verified.add((str(layer.root), key, _digest(new)))
        except OSError:
            pass
        finally:
            _unlink_quiet(tmp)

    def _touch(self, layer: Layer, key: str) -> None:
        """Last-used stamp for LRU prune: once per key per Store (mtime of stamps/<key>, not atime)."""
        p = layer.stamp_path(key)
        try:
            os.utime(p)
        except FileNotFoundError:
            try:
                os.close(os.open(p, os.O_WRONLY | os.O_CREAT, 0o600))
            except OSError:
                pass
        except OSError:
            pass
        self._touched.add(key)

    def _quarantine(self, layer: Layer, key: str, raw: bytes, reason: str,
                    bad_blobs: Iterable[str] = ()) -> None:
        digest = _digest(raw)
        self._counts.setdefault(layer.label, [0, 0, 0])[2] += 1
        where = "moved to quarantine"
        if layer.writable:
            try:
                qdir = layer.dir("quarantine")
                ts = f"{time.time():.6f}-{os.getpid()}"
                mpath = layer.manifest_path(key)
                with open(mpath, "rb") as f:
                    still_same = _digest(f.read()) == digest
                if still_same:  # another process may have republished it meanwhile
                    os.replace(mpath, qdir / f"{key}.{ts}.json")
                    (qdir / f"{key}.{ts}.reason").write_text(reason + "\n")
                for b in bad_blobs:  # so a republish writes fresh blobs instead of reusing bad ones
                    try:
                        os.replace(b, qdir / f"{os.path.basename(b)}.{ts}")
                    except FileNotFoundError:
                        pass
                _unlink_quiet(layer.stamp_path(key))
            except FileNotFoundError:
                pass  # already gone (pruned or quarantined by someone else)
            except OSError as e:
                _bad[(str(layer.root), key)] = digest
                where = f"ignored in this process (cannot move it: {_errname(e)})"
        else:
            _bad[(str(layer.root), key)] = digest
            where = "ignored in this process (read-only layer)"
        _warn_once(f"quarantine:{layer.root}:{key}:{digest}",
                   f"dsv4-jit cache: entry {key[:16]}... in {layer.label} is corrupt ({reason}); "
                   f"{where}, treated as a miss and rebuilt")

    # ---------------------------------------------------------------- building
    def get_or_build(self, key: str, fields: dict, build: Callable[[Path], dict | None]) -> Entry:
        """Return the entry for `key`, calling `build(staging_dir)` at most once across processes
        when it is missing. `build` writes the artifact files into staging_dir and returns an
        `extra` dict (or None)."""
        check_key(key)
        e = self._lookup(key, count=True)
        if e is not None:
            return e  # a hit needs no field check: the key is what was checked when it was built
        check_key_fields(fields)
        with self._mutex:
            klock = self._key_locks.setdefault(key, threading.Lock())
        with klock, self._file_lock(key):
            e = self._lookup(key, count=False)  # double-checked: a peer may have built it
            if e is not None:
                self._uncount_miss(e)  # served from the cache after all (built by the lock holder)
                return e
            return self._build_and_publish(key, fields, build)

    def _uncount_miss(self, found: Entry) -> None:
        """Turn the miss counted before waiting on the lock into what it was: a hit where `found` lives
        (so `cache stats` shows one miss per build, however many processes waited for it)."""
        reached = False   # layers before the one holding it did miss; it and those after were not searched
        for layer in self._search:
            c = self._counts.setdefault(layer.label, [0, 0, 0])
            if layer.root == found.layer:
                reached = True
                c[0] += 1
            if reached and c[1] > 0:
                c[1] -= 1

    @contextmanager
    def _file_lock(self, key: str) -> Iterator[None]:
        lock = None
        if self.writable is not None:
            path = self.writable.lock_path(key)
            try:
                lock = filelock.FileLock(path, timeout=self.lock_timeout)
                lock.acquire()
            except filelock.Timeout:
                lock = None
                _warn_once("lock-timeout", f"dsv4-jit cache: waited {self.lock_timeout:.0f}s for {path}; "
                           "building without it")
            except (OSError, NotImplementedError, RuntimeError) as e:
                lock = None
                _warn_once("no-lock", f"dsv4-jit cache: cannot lock {path} ({e}); continuing unlocked. "
                           "Entries stay whole (atomic rename, first manifest wins) but concurrent "
                           "processes may build the same kernel more than once.")
        try:
            yield
        finally:
            if lock is not None:
                try:
                    lock.release()
                except Exception:  # a failed unlock must not mask the build result
                    pass

    def _build_and_publish(self, key: str, fields: dict, build: Callable[[Path], dict | None]) -> Entry:
        layer = self.writable
        if layer is not None:
            staging = None
            try:
                staging = self._new_staging(layer)
                try:
                    extra = _check_extra(build(staging))
                except OSError as e:
                    if e.errno not in _BUILD_FULL_ERRNOS:
                        raise
                    self._degrade(f"building into {layer.root} failed ({_errname(e)})")
                else:
                    try:
                        return self._publish_dir(layer, key, fields, staging, extra)
                    except OSError as e:
                        if e.errno not in UNWRITABLE_ERRNOS:
                            raise
                        self._degrade(f"cannot publish to cache dir {layer.root} ({_errname(e)})")
                        return self._republish_in_fallback(key, fields, staging, extra)
            except OSError as e:
                if staging is not None or e.errno not in UNWRITABLE_ERRNOS:
                    raise
                self._degrade(f"cannot create a staging dir in {layer.root} ({_errname(e)})")
            finally:
                _rmtree(staging)  # nothing half-written stays behind, whatever happened
        fb = self._fallback_layer()
        staging = self._new_staging(fb)
        try:
            extra = _check_extra(build(staging))
            return self._publish_dir(fb, key, fields, staging, extra)
        finally:
            _rmtree(staging)

    def _republish_in_fallback(self, key: str, fields: dict, staging: Path, extra: dict) -> Entry:
        fb = self._fallback_layer()
        st2 = self._new_staging(fb)
        try:
            shutil.copytree(staging, st2, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".dsv4-*"))
            return self._publish_dir(fb, key, fields, st2, extra)
        finally:
            _rmtree(st2)

    def _new_staging(self, layer: Layer) -> Path:
        p = layer.dir("staging") / staging_name()
        os.mkdir(p, 0o700)
        return p

    @contextmanager
    def staging_dir(self) -> Iterator[tuple[Layer, Path]]:
        """A private dir on the target layer's filesystem, removed on exit (used by bundle import)."""
        layer = self.writable
        try:
            if layer is None:
                raise OSError(errno.EROFS, "no writable layer")
            path = self._new_staging(layer)
        except OSError as e:
            if layer is not None:
                self._degrade(f"cannot create a staging dir in {layer.root} ({_errname(e)})")
            layer = self._fallback_layer()
            path = self._new_staging(layer)
        try:
            yield layer, path
        finally:
            _rmtree(path)

    def publish(self, key: str, fields: dict, staging_dir: Path, extra: dict | None = None) -> Entry:
        """Publish the files already in `staging_dir` (which the caller owns and removes) under `key`.
        A second publish of an existing key is a no-op returning the existing entry."""
        check_key(key)
        check_key_fields(fields)
        with self.staging_dir() as (layer, scratch):
            shutil.copytree(staging_dir, scratch / "files")
            return self._publish_dir(layer, key, fields, scratch / "files", _check_extra(extra))

    def _publish_dir(self, layer: Layer, key: str, fields: dict, staging: Path, extra: dict) -> Entry:
        files: dict[str, tuple[Path, str, int]] = {}
        for dirpath, dirnames, filenames in os.walk(staging):
            for d in dirnames:
                if os.path.islink(os.path.join(dirpath, d)):
                    raise CacheError(f"build output {d!r} is a symlink; artifacts must be regular files")
            for fn in filenames:
                path = Path(dirpath, fn)
                name = path.relative_to(staging).as_posix()
                if name.startswith(".dsv4-"):
                    continue  # our own scratch files
                st = os.lstat(path)
                if not stat.S_ISREG(st.st_mode):
                    raise CacheError(f"build output {name!r} is a symlink or special file; artifacts "
                                     "must be regular files")
                why = check_member_name(name)
                if why:
                    raise CacheError(f"build output name {name!r} is not allowed: {why}")
                sha, size = hash_and_fsync(path)
                files[name] = (path, sha, size)
        if not files:
            raise CacheError(f"build for key {key[:16]}... wrote no files into {staging}")
        return self._publish_files(layer, key, fields, files, extra, scratch=staging)

    def _install_blobs(self, layer: Layer, files: Iterable[tuple[str, Path, str, int]], scratch: Path) -> None:
        """Link (or copy) each (name, src, sha, size) to its content address, then fsync each dir once."""
        blob_dirs: set[str] = set()
        for name, src, sha, size in files:
            dst = layer.blob_path(sha, name)
            d = os.path.dirname(dst)
            if d not in blob_dirs:
                os.makedirs(d, mode=0o700, exist_ok=True)
                blob_dirs.add(d)
            os.chmod(src, 0o444)
            _install_blob(Path(src), dst, size, scratch)
        for d in blob_dirs:
            fsync_dir(d)

    def _publish_files(self, layer: Layer, key: str, fields: dict,
                       files: dict[str, tuple[Path, str, int]], extra: dict, *, scratch: Path,
                       producer: dict | None = None, created: float | None = None,
                       origin: dict | None = None, blobs_ready: bool = False,
                       deferred_dirs: set[str] | None = None) -> Entry:
        """Blobs first (hard-linked or copied into place), fsync, then the manifest, created
        only if absent. `files`: name -> (path on this filesystem, sha256, size). Batch callers
        (import) install blobs up front (`blobs_ready`) and fsync manifest dirs once at the end
        (`deferred_dirs`): the manifest's own bytes are always fsynced before it becomes visible."""
        existing = self._lookup_in(layer, key, verify_hash=False)
        if existing is not None:
            return existing  # first manifest wins
        if not blobs_ready:
            self._install_blobs(layer, ((n, src, sha, size) for n, (src, sha, size) in files.items()), scratch)
        m = {"format": MANIFEST_FORMAT, "key": key, "fields": fields,
             "files": {n: {"sha256": sha, "size": size} for n, (_, sha, size) in sorted(files.items())},
             "created": time.time() if created is None else created,
             "producer": dict(self.producer if producer is None else producer),
             "extra": extra, "imported": origin is not None}
        if origin is not None:
            m["origin"] = origin
        raw = encode_manifest(m)
        tmp = scratch / f".dsv4-manifest-{uuid.uuid4().hex}"
        write_file_durable(tmp, raw, 0o444)
        pause = os.environ.get(PAUSE_BEFORE_MANIFEST_ENV)
        if pause:
            time.sleep(float(pause))
        mpath = layer.manifest_path(key)
        mdir = os.path.dirname(mpath)
        os.makedirs(mdir, mode=0o700, exist_ok=True)
        for _ in range(2):
            if _create_exclusive(tmp, mpath):
                break
            existing = self._lookup_in(layer, key, verify_hash=False)
            if existing is not None:
                return existing  # lost the race to a whole entry: use it
            # the existing manifest was corrupt and is now quarantined: try once more
        else:
            raise CacheError(f"could not publish {key[:16]}... in {layer.root}: the manifest keeps being replaced")
        if deferred_dirs is None:
            fsync_dir(mdir)
        else:
            deferred_dirs.add(mdir)
        if origin is None:  # we hashed every file just now; imported ones are re-checked on first read
            _verified.add((str(layer.root), key, _digest(raw)))
        if not layer.memory_only:
            self._touch(layer, key)
        return Entry(key, layer.root, m, {n: layer.blob_path(sha, n) for n, (_, sha, _) in files.items()},
                     False)

    # ------------------------------------------------------------ maintenance
    def entries(self, layer: str | os.PathLike | None = None) -> Iterator[Entry]:
        """Entries of every layer (or of one: a root path, 'writable' or 'read-only'), manifest-only
        (no blob checks; use verify())."""
        for L in self._select(layer):
            for key, mpath in L.iter_manifest_paths():
                try:
                    raw = mpath.read_bytes()
                    m = parse_manifest(raw, key)
                except (OSError, ManifestError):
                    continue
                if _bad.get((str(L.root), key)) == _digest(raw):
                    continue
                yield Entry(key, L.root, m, {n: L.blob_path(i["sha256"], n)
                                             for n, i in m["files"].items()}, not L.writable)

    def _select(self, layer: str | os.PathLike | None) -> list[Layer]:
        if layer is None:
            return list(self._search)
        if layer == "writable":
            return [L for L in self._search if L.writable]
        if layer == "read-only":
            return [L for L in self._search if not L.writable]
        root = Path(layer).expanduser().absolute()
        found = [L for L in self._search if L.root == root]
        if not found:
            raise CacheError(f"{root} is not a layer of this cache; layers: "
                             f"{', '.join(str(L.root) for L in self._search) or 'none'}")
        return found

    def verify(self, keys: Iterable[str] | None = None) -> dict:
        """Full sha256 check of every file of every entry (or of `keys`), quarantining bad ones."""
        t0 = time.monotonic()
        wanted = None if keys is None else [check_key(k) for k in keys]
        report: dict = {"checked": 0, "ok": 0, "bad": [], "bytes_hashed": 0}
        found: set[str] = set()
        hashed: dict[str, str] = {}
        for L in self._search:
            keylist = wanted if wanted is not None else [k for k, _ in L.iter_manifest_paths()]
            for key in keylist:
                try:
                    with open(L.manifest_path(key), "rb") as f:
                        raw = f.read()
                except OSError:
                    continue
                found.add(key)
                report["checked"] += 1
                problems: list[tuple[str, str]] = []
                try:
                    m = parse_manifest(raw, key)
                except ManifestError as e:
                    problems.append(("", str(e)))
                    m = {"files": {}}
                for name, info in m["files"].items():
                    p = L.blob_path(info["sha256"], name)
                    try:
                        if p not in hashed:
                            hashed[p] = sha256_file(p)
                            report["bytes_hashed"] += os.stat(p).st_size
                        if hashed[p] != info["sha256"]:
                            problems.append((p, f"{name}: sha256 mismatch"))
                    except OSError as e:
                        problems.append((p, f"{name}: unreadable ({_errname(e)})"))
                if problems:
                    reason = "; ".join(r for _, r in problems)
                    self._quarantine(L, key, raw, reason, [p for p, _ in problems if p and os.path.exists(p)])
                    report["bad"].append({"key": key, "layer": str(L.root), "reason": reason})
                else:
                    report["ok"] += 1
                    self._mark_verified(L, key, raw, m)
        if wanted is not None:
            report["missing"] = [k for k in wanted if k not in found]
        report["seconds"] = round(time.monotonic() - t0, 4)
        return report

    def prune(self, max_size_bytes: int) -> dict:
        """Evict least-recently-used whole entries from the writable layer until its blobs fit in
        `max_size_bytes`, then drop blobs no manifest references. Read-only layers are never touched."""
        if not isinstance(max_size_bytes, int) or max_size_bytes < 0:
            raise CacheError(f"max size must be a non-negative byte count, got {max_size_bytes!r}")
        layer = self.writable or self._fallback
        if layer is None:
            return {"layer": None, "evicted": [], "evicted_count": 0, "freed_bytes": 0,
                    "note": "no writable layer: nothing to prune"}
        with self._maintenance_lock(layer):
            report = maintenance.prune_layer(layer, max_size_bytes)
        self._touched.difference_update(report["evicted"])
        return report

    def clear(self) -> dict:
        """Empty the writable layer (read-only layers are untouched)."""
        layer = self.writable or self._fallback
        if layer is None:
            return {"layer": None, "entries_removed": 0, "bytes_removed": 0,
                    "note": "no writable layer: nothing to clear"}
        with self._maintenance_lock(layer):
            report = maintenance.clear_layer(layer)
        self._touched.clear()
        return report

    def _maintenance_lock(self, layer: Layer):
        # best effort: prune/clear are safe unlocked, just racy against each other
        return _best_effort_lock(layer.dir("locks") / "maintenance.lock", timeout=600)

    # ------------------------------------------------------------------ stats
    def _persisted_stats(self) -> dict:
        if self.writable is None:
            return {}
        try:
            data = json.loads(self.writable.stats_path.read_bytes())
            return data.get("layers", {}) if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def flush_stats(self) -> None:
        """Merge this process's hit/miss counters into stats.json of the writable layer (under a lock)."""
        with self._mutex:
            counts, self._counts = self._counts, {}
        counts.pop("memory-only", None)
        layer = self.writable
        if not counts or layer is None:
            return
        tmp = layer.dir("staging") / f".stats-{uuid.uuid4().hex}"
        try:
            # Unlocked if the lock cannot be had: at worst one process's counts are lost.
            with _best_effort_lock(layer.dir("locks") / "stats.lock", timeout=10):
                try:
                    data = json.loads(layer.stats_path.read_bytes())
                    if not isinstance(data, dict) or not isinstance(data.get("layers"), dict):
                        raise ValueError("bad stats.json")
                except (OSError, ValueError):
                    data = {"version": 1, "layers": {}}
                for label, (h, m, q) in counts.items():
                    rec = data["layers"].setdefault(label, {"hits": 0, "misses": 0, "quarantined": 0})
                    rec["hits"] = int(rec.get("hits", 0)) + h
                    rec["misses"] = int(rec.get("misses", 0)) + m
                    rec["quarantined"] = int(rec.get("quarantined", 0)) + q
                data["updated"] = time.time()
                write_file_durable(tmp, json.dumps(data, indent=1, sort_keys=True).encode(), 0o600)
                os.replace(tmp, layer.stats_path)
        except OSError as e:
            log.debug("cache: could not flush stats: %s", e)
            _unlink_quiet(tmp)

    def stats(self) -> dict:
        """Per layer: entries, bytes, hits, misses, quarantined (persisted + this process)."""
        persisted = self._persisted_stats()
        out = []
        for L in self._search:
            entries, nbytes = maintenance.layer_usage(L)
            p = persisted.get(L.label, {})
            c = self._counts.get(L.label, [0, 0, 0])
            if L.writable and not L.memory_only:
                quarantined = maintenance.count_quarantined(L)
            else:
                quarantined = sum(1 for (root, _k) in _bad if root == str(L.root)) or c[2]
            out.append({"layer": str(L.root),
                        "kind": "memory-only" if L.memory_only else ("writable" if L.writable else "read-only"),
                        "entries": entries, "bytes": nbytes,
                        "hits": int(p.get("hits", 0)) + c[0], "misses": int(p.get("misses", 0)) + c[1],
                        "quarantined": quarantined})
        return {"root": str(self.root), "memory_only": self.memory_only,
                "degraded_reason": self.degraded_reason, "layers": out}

    def close(self) -> None:
        self.flush_stats()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store(root={str(self.root)!r}, layers={[str(L.root) for L in self._search]!r})"


# ---------------------------------------------------------------------- helpers
def _unlink_quiet(path: str | os.PathLike) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _hash_mismatches(m: dict, files: dict[str, str]) -> list[tuple[str, str]]:
    bad = []
    for name, path in files.items():
        try:
            if sha256_file(path) != m["files"][name]["sha256"]:
                bad.append((str(path), f"{name}: sha256 mismatch"))
        except OSError as e:
            bad.append((str(path), f"{name}: unreadable ({_errname(e)})"))
    return bad


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError as e:
        if e.errno not in _NO_LINK_ERRNOS:
            raise
        shutil.copyfile(src, dst)
        with open(dst, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(dst, 0o444)


def _install_blob(src: Path, dst: str, size: int, scratch: Path) -> None:
    """Put `src` at content address `dst`. An existing blob of the right size is kept (same
    address, same bytes unless damaged, which verify/first-read catches)."""
    try:
        os.link(src, dst)
        return
    except FileExistsError:
        try:
            if os.stat(dst).st_size == size:
                return
        except FileNotFoundError:
            pass
    except OSError as e:
        if e.errno not in _NO_LINK_ERRNOS:
            raise
    tmp = scratch / f".dsv4-blob-{uuid.uuid4().hex}"
    _link_or_copy(src, tmp)
    os.replace(tmp, dst)


def _create_exclusive(tmp: Path, dst: str) -> bool:
    """Atomically create `dst` from whole file `tmp` unless `dst` exists. True if we created it."""
    try:
        os.link(tmp, dst)
        return True
    except FileExistsError:
        return False
    except OSError as e:
        if e.errno not in _NO_LINK_ERRNOS:
            raise
    if os.path.exists(dst):  # no hard links here (some FUSE/NFS): replace, with a tiny race window
        return False
    os.replace(tmp, dst)
    return True


def _clean_dead_temp_layers() -> None:
    """Private temp layers of processes that died without running atexit."""
    import glob
    prefix = os.path.join(tempfile.gettempdir(), f"dsv4-jit-mem-{host_tag()}-")
    for d in glob.glob(prefix + "*"):
        pid = d[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


@atexit.register
def _at_exit() -> None:
    for s in list(_live_stores):
        try:
            s.flush_stats()
        except Exception:
            pass
    for d in _temp_dirs:
        shutil.rmtree(d, ignore_errors=True)
