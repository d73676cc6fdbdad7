"""Remote bundles: export / import / `check --bundle` through fsspec URLs (memory://, file://, an
object-store-like filesystem) and over http(s) from a local server on 127.0.0.1 (through fsspec when
aiohttp is installed, and through the standard library without it); atomic writes, streaming reads,
one-line errors naming what to install."""
from __future__ import annotations

import functools
import http.server
import io
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from dsv4_jit.cache_tools import BundleError, Store, compute_key, export_bundle, import_bundle
from dsv4_jit.cache_tools import bundle as bundle_mod

fsspec = pytest.importorskip("fsspec")

FP = {"tilelang": "0.1.15", "tilelang_libs": "ab" * 32, "nvcc": "13.0.88", "host_abi": "tvm_ffi-0.1-linux-x86_64"}
pytestmark = pytest.mark.usefixtures("isolated_cache")


def _store(root: Path, n: int = 3, size: int = 20_000) -> Store:
    s = Store(root, layers=[])
    for i in range(n):
        f = {"kernel": "mhc_pre" if i % 2 else "mhc_post", "arch": "sm_120a", "variant": i}

        def build(st: Path, i=i):
            (st / "kernel.so").write_bytes(b"\x7fELF" + os.urandom(size + i))
            return {"smem_bytes": 1000 * (i + 1)}
        s.get_or_build(compute_key(f), f, build)
    return s


@pytest.fixture
def src_store(tmp_path) -> Store:
    return _store(tmp_path / "src")


def content(store: Store) -> dict:
    return {e.key: (e.fields, {n: p.read_bytes() for n, p in e.files.items()}) for e in store.entries()}


def mem_url(name: str = "bundle.tar.gz") -> tuple[str, str]:
    d = f"/dsv4-remote-{uuid.uuid4().hex[:8]}"
    return f"memory://{d}/{name}", d


# ---------------------------------------------------------------- memory:// and file://
def test_memory_url_round_trip_via_temp_name_and_move(src_store, tmp_path, monkeypatch):
    url, d = mem_url()
    fs = fsspec.filesystem("memory")
    opened, moved = [], []
    real_open, real_mv = fs.open, fs.mv
    monkeypatch.setattr(fs, "open", lambda p, mode="rb", **k: opened.append((p, mode)) or real_open(p, mode, **k))
    monkeypatch.setattr(fs, "mv", lambda a, b, **k: moved.append((a, b)) or real_mv(a, b, **k))
    r = export_bundle(src_store, url, FP)
    assert r["entries"] == 3 and r["compressed_bytes"] == fs.size(f"{d}/bundle.tar.gz") > 60_000
    # not a rename-less object store: written under a hidden temp name, then moved over the destination
    (tmp_name, mode), = [o for o in opened if o[1] == "wb"]
    assert Path(tmp_name).name.startswith(".bundle.tar.gz.") and tmp_name.endswith(".tmp")
    assert moved == [(tmp_name, f"{d}/bundle.tar.gz")]
    assert [Path(p).name for p in fs.ls(d, detail=False)] == ["bundle.tar.gz"]
    assert bundle_mod.read_manifest(url)["entries"][0]["key"] in {e.key for e in src_store.entries()}
    dst = Store(tmp_path / "dst", layers=[])
    ri = import_bundle(dst, url, FP)
    assert (ri["installed"], ri["compressed_bytes"]) == (3, r["compressed_bytes"])
    assert content(dst) == content(src_store) and dst.verify()["bad"] == []
    assert import_bundle(dst, url, FP)["already_present"] == 3


def test_failed_remote_export_leaves_nothing_and_keeps_the_old_bundle(src_store, tmp_path, monkeypatch):
    url, d = mem_url()
    export_bundle(src_store, url, FP)
    fs = fsspec.filesystem("memory")
    old = fs.cat(f"{d}/bundle.tar.gz")
    real = bundle_mod._write_tar

    def half(out, *a):
        out.write(b"\x1f\x8b partial")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(bundle_mod, "_write_tar", half)
    more = _store(tmp_path / "more", n=1)
    with pytest.raises(OSError, match="No space"):
        export_bundle(more, url, FP)
    assert fs.cat(f"{d}/bundle.tar.gz") == old and [Path(p).name for p in fs.ls(d, detail=False)] == ["bundle.tar.gz"]
    monkeypatch.setattr(bundle_mod, "_write_tar", real)


class _Upload:
    """An object-store upload: nothing is visible until close(); discard() aborts it (like S3File)."""

    def __init__(self, fs, path: str) -> None:
        self.fs, self.path, self.buf, self.closed, self.discarded = fs, path, io.BytesIO(), False, False

    def write(self, b) -> int:
        return self.buf.write(b)

    def flush(self) -> None:
        pass

    def discard(self) -> None:
        self.discarded = True

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            from fsspec.implementations.memory import MemoryFile
            self.fs.store[self.path] = MemoryFile(self.fs, self.path, self.buf.getvalue())


def _object_store(monkeypatch):
    from fsspec.implementations.memory import MemoryFileSystem

    class ObjFS(MemoryFileSystem):
        protocol = "dsv4obj"
        uploads: list = []

        @classmethod
        def _strip_protocol(cls, path):
            return MemoryFileSystem._strip_protocol(path.replace("dsv4obj://", "", 1))

        def _open(self, path, mode="rb", **kw):
            if mode == "wb":
                u = _Upload(self, self._strip_protocol(path))
                self.uploads.append(u)
                return u
            return super()._open(path, mode, **kw)

        def mv(self, *a, **k):
            raise AssertionError("an object store has no rename: no temp name + move")
    fsspec.register_implementation("dsv4obj", ObjFS, clobber=True)
    monkeypatch.setattr(bundle_mod, "OBJECT_STORE_SCHEMES", bundle_mod.OBJECT_STORE_SCHEMES | {"dsv4obj"})
    return ObjFS


def test_object_store_export_is_one_upload_to_the_final_key(src_store, tmp_path, monkeypatch):
    ObjFS = _object_store(monkeypatch)
    d = f"/dsv4-obj-{uuid.uuid4().hex[:8]}"
    url = f"dsv4obj://{d}/b.tar.gz"
    r = export_bundle(src_store, url, FP)
    (u,) = ObjFS.uploads
    assert u.path == f"{d}/b.tar.gz" and u.closed and not u.discarded and r["compressed_bytes"] == len(u.buf.getvalue())
    assert import_bundle(Store(tmp_path / "dst", layers=[]), url, FP)["installed"] == 3
    # a failure mid-stream aborts the upload: nothing appears at the key, and close() (= commit) is never called
    ObjFS.uploads.clear()

    def half(out, *a):
        out.write(b"partial")
        raise RuntimeError("network went away")
    monkeypatch.setattr(bundle_mod, "_write_tar", half)
    with pytest.raises(RuntimeError):
        export_bundle(src_store, f"dsv4obj://{d}/c.tar.gz", FP)
    (u,) = ObjFS.uploads
    assert u.discarded and not fsspec.filesystem("dsv4obj").exists(f"{d}/c.tar.gz")


def test_file_url_round_trip_and_check_bundle(src_store, tmp_path):
    b = tmp_path / "out dir" / "b.tar.xz"
    url = "file://" + str(b)
    assert export_bundle(src_store, url, FP)["entries"] == 3 and b.read_bytes()[:6] == b"\xfd7zXZ\x00"
    assert [p.name for p in b.parent.iterdir()] == ["b.tar.xz"]
    assert len(bundle_mod.read_manifest(url)["entries"]) == 3
    from dsv4_jit.warmup.cli import _bundle_keys
    assert _bundle_keys(url) == _bundle_keys(str(b)) == {e.key for e in src_store.entries()}
    assert import_bundle(Store(tmp_path / "dst", layers=[]), url, FP)["installed"] == 3


def test_read_manifest_streams_only_the_head(tmp_path, monkeypatch):
    big = _store(tmp_path / "big", n=2, size=6 << 20)   # ~12 MB of incompressible blobs
    url, _ = mem_url()
    export_bundle(big, url, FP)
    total = fsspec.filesystem("memory").size(url[len("memory://"):])
    got = []
    real = bundle_mod._SafeReader.readinto
    monkeypatch.setattr(bundle_mod._SafeReader, "readinto", lambda self, b: got.append(real(self, b)) or got[-1])
    assert len(bundle_mod.read_manifest(url)["entries"]) == 2
    assert total > 12 << 20 and sum(got) <= 2 * bundle_mod.CHUNK   # the manifest's chunk, not the bundle


# ---------------------------------------------------------------- errors
def test_missing_fsspec_and_unknown_schemes_are_clear(src_store, tmp_path, monkeypatch):
    dst = Store(tmp_path / "dst", layers=[])
    with pytest.raises(BundleError, match="fsspec knows no filesystem for nosuchproto://"):
        import_bundle(dst, "nosuchproto://x/b.tar.gz", FP)
    try:
        import s3fs  # noqa: F401
    except ImportError:
        with pytest.raises(BundleError, match=r"implementation for s3:// is not installed \(.*s3fs"):
            export_bundle(src_store, "s3://bucket/b.tar.gz", FP)
    with pytest.raises(BundleError, match="bundle not found: memory://"):
        import_bundle(dst, "memory://no/such/bundle.tar.gz", FP)
    with pytest.raises(BundleError, match="http.s. URLs are read-only"):
        export_bundle(src_store, "https://example.invalid/b.tar.gz", FP)
    monkeypatch.setitem(sys.modules, "fsspec", None)   # `import fsspec` raises ImportError
    for call in (lambda: import_bundle(dst, "memory://x/b.tar.gz", FP),
                 lambda: export_bundle(src_store, "gs://bucket/b.tar.gz", FP)):
        with pytest.raises(BundleError, match=r"needs fsspec: pip install 'dsv4-jit\[remote\]'"):
            call()


def test_cli_errors_are_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSV4_JIT_")}
    env.update(DSV4_JIT_CACHE_DIR=str(tmp_path / "cache"), XDG_CACHE_HOME=str(tmp_path / "xdg"))
    for argv, needle in ((["cache", "import", "nosuchproto://x/b.tar.gz"], "fsspec knows no filesystem"),
                         (["cache", "export", "http://127.0.0.1:9/b.tar.gz"], "read-only"),
                         (["check", "--bundle", "memory://nope/b.tar.gz"], "bundle not found")):
        r = subprocess.run([sys.executable, "-m", "dsv4_jit", *argv], env=env, capture_output=True, text=True,
                           timeout=120)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 1 and len(lines) == 1 and needle in lines[0], r.stderr


# ---------------------------------------------------------------- http(s), read-only, from 127.0.0.1
class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a) -> None:
        pass


@pytest.fixture
def http_dir(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield root, f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def _http_paths():
    try:
        import aiohttp  # noqa: F401
        return ["fsspec", "stdlib"]
    except ImportError:
        return ["stdlib"]


@pytest.mark.parametrize("via", _http_paths())
def test_http_import_and_manifest(src_store, tmp_path, http_dir, monkeypatch, via):
    root, base = http_dir
    export_bundle(src_store, root / "b.tar.gz", FP)
    if via == "stdlib":   # no fsspec HTTP implementation: the standard library streams it
        def no_http(url, **k):
            raise ImportError("HTTPFileSystem requires aiohttp")
        monkeypatch.setattr(fsspec.core, "url_to_fs", no_http)
    else:
        calls = []
        real = fsspec.core.url_to_fs
        monkeypatch.setattr(fsspec.core, "url_to_fs", lambda u, **k: calls.append(u) or real(u, **k))
    url = f"{base}/b.tar.gz"
    assert len(bundle_mod.read_manifest(url)["entries"]) == 3
    dst = Store(tmp_path / f"dst-{via}", layers=[])
    r = import_bundle(dst, url, FP)
    assert r["installed"] == 3 and content(dst) == content(src_store)
    if via == "fsspec":
        assert url in calls
    else:
        assert r["compressed_bytes"] == (root / "b.tar.gz").stat().st_size   # Content-Length
    with pytest.raises(BundleError, match="bundle not found"):
        import_bundle(dst, f"{base}/nope.tar.gz", FP)
    (root / "junk.tar.gz").write_bytes(b"<html>not a bundle</html>")
    with pytest.raises(BundleError, match="not a dsv4-jit bundle"):
        import_bundle(dst, f"{base}/junk.tar.gz", FP)
    (root / "trunc.tar.gz").write_bytes((root / "b.tar.gz").read_bytes()[:-300])
    with pytest.raises(BundleError, match="corrupt or truncated"):
        import_bundle(Store(tmp_path / f"t-{via}", layers=[]), f"{base}/trunc.tar.gz", FP)
