"""CPU tests of the artifact store: real files, real processes, real signals."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from dsv4_jit.cache_tools import (CacheError, CacheSecurityError, CacheWarning, KeyFieldError, Store,
                                  check_key_fields, compute_key)
from dsv4_jit.cache_tools import maintenance
from dsv4_jit.cache_tools import store as store_mod
from dsv4_jit.errors import Dsv4JitError


pytestmark = pytest.mark.usefixtures("isolated_cache")


def fields_for(i: int = 0, kernel: str = "mhc_pre", arch: str = "sm_90a") -> dict:
    return {"kernel": kernel, "arch": arch, "block_m": 64, "variant": i}


def builder(payload: bytes, counter: list | None = None, extra: dict | None = None):
    def build(staging: Path):
        if counter is not None:
            counter.append(1)
        (staging / "kernel.so").write_bytes(payload)
        (staging / "kernel.cu").write_text("// source\n")
        return extra
    return build


def put(store: Store, i: int = 0, size: int = 1000, **kw) -> tuple[str, object]:
    f = fields_for(i, **kw)
    key = compute_key(f)
    return key, store.get_or_build(key, f, builder(os.urandom(size)))


def tree(root: Path) -> dict:
    """Every file under root with its bytes' sha256: 'nothing changed' means this is equal."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        out[rel] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return out


def flip_byte(path: Path, offset: int = 10) -> None:
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def cache_warnings(w: list, needle: str) -> list:
    return [x for x in w if issubclass(x.category, CacheWarning) and needle in str(x.message)]


# ---------------------------------------------------------------------- keys
def test_compute_key_is_sha256_of_canonical_json():
    f = {"b": [1, 2], "a": {"y": 1, "x": "s"}}
    assert compute_key(f) == hashlib.sha256(b'{"a":{"x":"s","y":1},"b":[1,2]}').hexdigest()
    assert compute_key(f) == compute_key({"a": {"x": "s", "y": 1}, "b": [1, 2]})
    with pytest.raises(KeyFieldError):
        compute_key({"x": float("nan")})
    with pytest.raises(KeyFieldError):
        compute_key({"x": object()})


def test_check_key_fields_rejects_local_values(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", "/home/zedq")
    monkeypatch.setenv("LOGNAME", "zedq")
    monkeypatch.setenv("USER", "zedq")
    monkeypatch.setattr("socket.gethostname", lambda: "gpu-node-17.example.com")
    check_key_fields({"kernel": "mhc_pre", "flags": ["-O3", "--use_fast_math"], "arch": "sm_90a",
                      "tir_sha256": "ab" * 32, "user_tuned": True, "n": 3})
    bad = [
        {"include": "/usr/local/cuda/include"},
        {"flags": ["-O3", {"inc": "/opt/tilelang/src"}]},
        {"cache": "~/.cache/x"},
        {"note": "built in /home/zedq/src"},
        {"note": "relative/home/zedq/x"},
        {"host": "gpu-node-17.example.com"},
        {"tag": "built-by-zedq"},
        {"/abs/key": 1},
    ]
    for f in bad:
        with pytest.raises(KeyFieldError) as ei:
            check_key_fields(f)
        assert "content only" in str(ei.value)
        assert isinstance(ei.value, Dsv4JitError)
    s = Store(tmp_path / "s", layers=[])
    with pytest.raises(KeyFieldError, match="absolute path"):
        s.get_or_build(compute_key({"p": "/x"}), {"p": "/x"}, builder(b"x"))
    assert list((tmp_path / "s" / "v1" / "ac").iterdir()) == []


def test_bad_key_is_a_clear_error(tmp_path):
    s = Store(tmp_path / "c", layers=[])
    with pytest.raises(KeyFieldError, match="64 lowercase hex"):
        s.lookup("not-a-key")


# --------------------------------------------------------------- publishing
def test_publish_and_lookup_roundtrip(tmp_path):
    root = tmp_path / "cache"
    s = Store(root, layers=[])
    assert (os.stat(root).st_mode & 0o777) == 0o700
    payload = os.urandom(5000)
    f = fields_for()
    key = compute_key(f)
    calls: list = []
    e = s.get_or_build(key, f, builder(payload, calls, {"smem_bytes": 98304}))
    assert calls == [1]
    assert e.key == key and e.layer == root and not e.read_only_layer
    assert e.fields == f and e.extra == {"smem_bytes": 98304}
    so = e.files["kernel.so"]
    assert so.is_absolute() and so.suffix == ".so" and so.read_bytes() == payload
    assert so.name.startswith(hashlib.sha256(payload).hexdigest())
    assert (os.stat(so).st_mode & 0o777) == 0o444
    m = json.loads((root / "v1" / "ac" / key[:2] / f"{key}.json").read_text())
    assert m["files"]["kernel.so"] == {"sha256": hashlib.sha256(payload).hexdigest(), "size": 5000}
    assert m["producer"]["dsv4_jit"] and m["created"] > 0 and m["imported"] is False
    assert (root / "v1" / "stamps" / key).exists()
    assert list((root / "v1" / "staging").iterdir()) == []
    # a fresh store (a new process would do the same) hits without building
    s2 = Store(root, layers=[])
    e2 = s2.get_or_build(key, f, builder(b"other", calls))
    assert calls == [1] and e2.files["kernel.so"].read_bytes() == payload
    assert s2.lookup_many([key, compute_key(fields_for(9))]) == {key: e2, compute_key(fields_for(9)): None}


def test_second_publish_of_a_key_is_a_noop(tmp_path):
    s = Store(tmp_path / "c", layers=[])
    f = fields_for()
    key = compute_key(f)
    for i, payload in enumerate((b"first" * 100, b"second" * 100)):
        d = tmp_path / f"out{i}"
        d.mkdir()
        (d / "kernel.so").write_bytes(payload)
        e = s.publish(key, f, d, {"i": i})
    assert e.files["kernel.so"].read_bytes() == b"first" * 100 and e.extra == {"i": 0}


def test_build_failure_leaves_nothing(tmp_path):
    s = Store(tmp_path / "c", layers=[])
    f = fields_for()

    def bad_build(st: Path):
        (st / "kernel.so").write_bytes(b"partial")
        raise RuntimeError("nvcc failed")
    with pytest.raises(RuntimeError, match="nvcc failed"):
        s.get_or_build(compute_key(f), f, bad_build)
    assert s.lookup(compute_key(f)) is None
    assert list((tmp_path / "c" / "v1" / "staging").iterdir()) == []
    with pytest.raises(CacheError, match="wrote no files"):
        s.get_or_build(compute_key(f), f, lambda st: None)
    with pytest.raises(CacheError, match="symlink"):
        s.get_or_build(compute_key(f), f, lambda st: os.symlink("/etc/passwd", st / "x.so"))


RACE_SCRIPT = r'''
import hashlib, os, sys, time
from pathlib import Path
from dsv4_jit.cache_tools import Store, compute_key
root, count_file, ready_dir, go_file, mode = sys.argv[1:6]
if mode == "nolock":
    import errno, filelock
    def broken(self, *a, **k):
        raise OSError(errno.ENOLCK, "No locks available")
    filelock.FileLock.acquire = broken
fields = {"kernel": "race", "arch": "sm_90a", "block": 64}
key = compute_key(fields)
store = Store(root, layers=[])
open(os.path.join(ready_dir, str(os.getpid())), "w").close()
while not os.path.exists(go_file):
    time.sleep(0.002)
def build(st):
    with open(count_file, "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(0.3)
    (st / "kernel.so").write_bytes(os.urandom(200_000))  # different bytes per build: a mix would show
    return {"smem": 4096}
e = store.get_or_build(key, fields, build)
print(hashlib.sha256(e.files["kernel.so"].read_bytes()).hexdigest(), e.extra["smem"])
'''


def _race(tmp_path: Path, mode: str, n: int = 8) -> tuple[list[str], list[str], Path]:
    script = tmp_path / "race.py"
    script.write_text(RACE_SCRIPT)
    root, count, ready, go = tmp_path / "cache", tmp_path / "builds.txt", tmp_path / "ready", tmp_path / "go"
    ready.mkdir()
    procs = [subprocess.Popen([sys.executable, str(script), str(root), str(count), str(ready), str(go), mode],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(n)]
    deadline = time.time() + 60
    while len(list(ready.iterdir())) < n and time.time() < deadline:
        time.sleep(0.01)
    go.touch()
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        outs.append(out.strip())
    builds = count.read_text().split() if count.exists() else []
    return outs, builds, root


def test_eight_processes_race_build_once(tmp_path):
    outs, builds, root = _race(tmp_path, "lock")
    assert len(builds) == 1, f"built {len(builds)} times"
    assert len(set(outs)) == 1 and outs[0].endswith(" 4096")
    assert list((root / "v1" / "staging").iterdir()) == []


def test_race_without_locks_still_whole(tmp_path):
    """ENOLCK (e.g. NFS): duplicate builds are allowed, mixed or partial entries are not."""
    outs, builds, root = _race(tmp_path, "nolock")
    assert len(builds) >= 1
    assert len(set(outs)) == 1, "processes saw different bytes for one key"
    manifests = list((root / "v1" / "ac").rglob("*.json"))
    assert len(manifests) == 1
    s = Store(root, layers=[])
    assert s.verify()["bad"] == []


CRASH_SCRIPT = r'''
import os, sys, time
from dsv4_jit.cache_tools import Store, compute_key
root, marker, phase = sys.argv[1:4]
fields = {"kernel": "crash", "arch": "sm_90a"}
store = Store(root, layers=[])
def build(st):
    (st / "kernel.so").write_bytes(b"\x7fELF" + os.urandom(100_000))
    open(marker, "w").close()
    if phase == "build":
        time.sleep(60)
store.get_or_build(compute_key(fields), fields, build)
'''


@pytest.mark.parametrize("phase", ["build", "before_manifest"])
def test_sigkill_mid_publish_leaves_no_entry(tmp_path, phase):
    script = tmp_path / "crash.py"
    script.write_text(CRASH_SCRIPT)
    root, marker = tmp_path / "cache", tmp_path / "marker"
    env = dict(os.environ)
    if phase == "before_manifest":
        env[store_mod.PAUSE_BEFORE_MANIFEST_ENV] = "60"
    p = subprocess.Popen([sys.executable, str(script), str(root), str(marker), phase], env=env)
    deadline = time.time() + 60
    blobs = root / "v1" / "blobs"

    def ready() -> bool:
        if not marker.exists():
            return False
        return phase == "build" or any(blobs.rglob("*.so"))
    while not ready() and time.time() < deadline and p.poll() is None:
        time.sleep(0.01)
    assert ready(), "writer never reached the crash point"
    staged = list((root / "v1" / "staging").iterdir())
    assert len(staged) == 1 and staged[0].name.split("-")[1] == str(p.pid)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    key = compute_key({"kernel": "crash", "arch": "sm_90a"})
    assert not (root / "v1" / "ac" / key[:2] / f"{key}.json").exists()
    s = Store(root, layers=[])  # opening cleans the dead writer's staging dir
    assert list((root / "v1" / "staging").iterdir()) == []
    assert s.lookup(key) is None
    calls: list = []
    e = s.get_or_build(key, {"kernel": "crash", "arch": "sm_90a"}, builder(b"\x7fELF-good", calls))
    assert calls == [1] and e.files["kernel.so"].read_bytes() == b"\x7fELF-good"
    assert s.verify()["bad"] == []
    if phase == "before_manifest":  # the killed writer's blob is an orphan; prune drops it
        r = maintenance.prune_layer(s.writable, 1 << 40, orphan_grace_s=0)
        assert r["orphan_blobs_removed"] == 1 and r["evicted_count"] == 0


def test_stale_staging_rules(tmp_path):
    s = Store(tmp_path / "c", layers=[])
    staging = tmp_path / "c" / "v1" / "staging"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    tag = store_mod.host_tag()
    (staging / f"{tag}-{dead.pid}-aaaa").mkdir()                  # dead pid here: removed
    (staging / f"{tag}-{os.getppid()}-bbbb").mkdir()              # live pid: kept
    (staging / f"ffffffff-{dead.pid}-cccc").mkdir()               # other host, recent: kept
    old = staging / "ffffffff-1-dddd"
    old.mkdir()
    os.utime(old, (time.time() - 7200, time.time() - 7200))      # other host, >1 h: removed
    Store(tmp_path / "c", layers=[])
    assert sorted(p.name for p in staging.iterdir()) == sorted([f"{tag}-{os.getppid()}-bbbb",
                                                                 f"ffffffff-{dead.pid}-cccc"])
    del s


def test_lock_failure_proceeds_unlocked(tmp_path, monkeypatch):
    import filelock

    def broken(self, *a, **k):
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(filelock.FileLock, "acquire", broken)
    s = Store(tmp_path / "c", layers=[])
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        key, e = put(s)
        put(s, 1)
    assert e.files["kernel.so"].exists()
    assert len(cache_warnings(w, "continuing unlocked")) == 1


# ---------------------------------------------------------------- integrity
def test_flipped_byte_found_by_verify_and_quarantined(tmp_path):
    root = tmp_path / "c"
    s = Store(root, layers=[])
    key, e = put(s, size=4000)
    key2, e2 = put(s, 1)
    flip_byte(e.files["kernel.so"])
    with pytest.warns(CacheWarning, match="sha256 mismatch"):
        r = s.verify()
    assert r["checked"] == 2 and r["ok"] == 1 and [b["key"] for b in r["bad"]] == [key]
    assert "sha256 mismatch" in r["bad"][0]["reason"]
    assert s.lookup(key) is None and s.lookup(key2) is not None
    q = list((root / "v1" / "quarantine").iterdir())
    assert any(p.name.startswith(key) and p.suffix == ".json" for p in q)
    assert not e.files["kernel.so"].exists()  # bad blob moved away, so a rebuild writes a fresh one
    assert s.stats()["layers"][0]["quarantined"] == 1
    calls: list = []
    e3 = s.get_or_build(key, fields_for(0), builder(b"rebuilt", calls))
    assert calls == [1] and e3.files["kernel.so"].read_bytes() == b"rebuilt"


def test_truncated_blob_and_bad_manifest_are_misses(tmp_path):
    root = tmp_path / "c"
    s = Store(root, layers=[])
    key, e = put(s)
    os.chmod(e.files["kernel.so"], 0o644)
    with open(e.files["kernel.so"], "r+b") as f:
        f.truncate(10)
    key2, _ = put(s, 1)
    mpath = root / "v1" / "ac" / key2[:2] / f"{key2}.json"
    os.chmod(mpath, 0o644)
    mpath.write_text('{"format": 1, "key": "')  # torn write from some other tool
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert s.lookup(key) is None
        assert s.lookup(key2) is None
    assert len(cache_warnings(w, "is corrupt")) == 2
    assert not mpath.exists()
    assert s.stats()["layers"][0]["quarantined"] == 2


def test_read_only_layer_checks_hash_once_and_never_changes_it(tmp_path):
    base = tmp_path / "base"
    b = Store(base, layers=[])
    good, ge = put(b, 0)
    bad, be = put(b, 1)
    flip_byte(be.files["kernel.so"])
    before = tree(base)
    store_mod._verified.clear()  # as in a new process: this one hashed both when publishing them
    s = Store(tmp_path / "rw", layers=[base])
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert s.lookup(bad) is None
        assert s.lookup(bad) is None
    assert len(cache_warnings(w, "read-only layer")) == 1
    e = s.lookup(good)
    assert e is not None and e.read_only_layer and e.layer == base
    assert (str(base), good) in {(r, k) for r, k, _ in store_mod._verified}
    assert tree(base) == before  # nothing moved or stamped in a read-only layer
    ro = [L for L in s.stats()["layers"] if L["kind"] == "read-only"][0]
    assert ro["quarantined"] == 1 and ro["hits"] == 1 and ro["entries"] == 2
    # the bad key is rebuilt into the writable layer and wins from then on
    e2 = s.get_or_build(bad, fields_for(1), builder(b"fresh"))
    assert e2.layer == tmp_path / "rw" and s.lookup(bad).files["kernel.so"].read_bytes() == b"fresh"


def test_env_layers_and_default_dir(tmp_path, monkeypatch):
    base = tmp_path / "base"
    key, _ = put(Store(base, layers=[]))
    monkeypatch.setenv("DSV4_JIT_CACHE_DIR", str(tmp_path / "env-rw"))
    monkeypatch.setenv("DSV4_JIT_CACHE_LAYERS", os.pathsep.join([str(base), str(tmp_path / "absent")]))
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        s = Store()
    assert s.root == tmp_path / "env-rw" and [L.root for L in s.read_only] == [base]
    assert s.lookup(key).read_only_layer
    monkeypatch.delenv("DSV4_JIT_CACHE_DIR")
    assert str(store_mod.default_cache_dir()).startswith(str(tmp_path / "xdg"))


# ------------------------------------------------------- degraded operation
def _deny_writes_under(monkeypatch, root: Path, err: int) -> None:
    """Make every write-ish syscall under `root` fail like a read-only mount or full disk."""
    r = str(root)

    def under(p) -> bool:
        return os.path.abspath(os.fsdecode(p)).startswith(r)

    def fail(p):
        raise OSError(err, os.strerror(err), os.fsdecode(p))
    real = {n: getattr(os, n) for n in ("mkdir", "open", "link", "rename", "replace", "unlink", "utime")}

    def mkdir(p, *a, **k):
        return fail(p) if under(p) else real["mkdir"](p, *a, **k)

    def open_(p, flags, *a, **k):
        if under(p) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            fail(p)
        return real["open"](p, flags, *a, **k)

    def two(name):
        def f(src, dst, *a, **k):
            return fail(dst) if under(src) or under(dst) else real[name](src, dst, *a, **k)
        return f

    def one(name):
        def f(p, *a, **k):
            return fail(p) if under(p) else real[name](p, *a, **k)
        return f
    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(os, "open", open_)
    for n in ("link", "rename", "replace"):
        monkeypatch.setattr(os, n, two(n))
    for n in ("unlink", "utime"):
        monkeypatch.setattr(os, n, one(n))


@pytest.mark.parametrize("err", [errno.EROFS, errno.EACCES])
def test_unwritable_new_dir_works_memory_only(tmp_path, monkeypatch, err):
    root = tmp_path / "ro" / "cache"
    _deny_writes_under(monkeypatch, tmp_path / "ro", err)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        s = Store(root, layers=[])
        calls: list = []
        f = fields_for()
        e = s.get_or_build(compute_key(f), f, builder(b"\x7fELF-mem", calls, {"smem": 1}))
        e_again = s.get_or_build(compute_key(f), f, builder(b"x", calls))
        put(s, 1)
        s.flush_stats()
    assert s.memory_only and s.writable is None
    assert calls == [1]
    assert e.files["kernel.so"].read_bytes() == b"\x7fELF-mem" and e.extra == {"smem": 1}
    assert e_again.files == e.files and not str(e.layer).startswith(str(tmp_path / "ro"))
    assert len(cache_warnings(w, "continuing without a persistent cache")) == 1
    assert not (tmp_path / "ro").exists()
    s.prune(0)  # maintenance on the private layer does not raise either


def test_read_only_existing_cache_still_serves_hits(tmp_path, monkeypatch):
    root = tmp_path / "baked"
    key, e0 = put(Store(root, layers=[]), 0)
    before = tree(root)
    _deny_writes_under(monkeypatch, root, errno.EROFS)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        s = Store(root, layers=[])
        e = s.lookup(key)
        key1, e1 = put(s, 1)
    assert e is not None and e.read_only_layer and e.files["kernel.so"].read_bytes() == e0.files["kernel.so"].read_bytes()
    assert not str(e1.layer).startswith(str(root)) and e1.files["kernel.so"].exists()
    assert len(cache_warnings(w, "continuing without a persistent cache")) == 1
    monkeypatch.undo()
    assert tree(root) == before


def test_disk_full_during_publish_falls_back_cleanly(tmp_path, monkeypatch):
    root = tmp_path / "c"
    s = Store(root, layers=[])
    key0, _ = put(s, 0)
    blobs = str(root / "v1" / "blobs")
    real_link = os.link

    def link(src, dst, *a, **k):
        if os.fsdecode(dst).startswith(blobs):
            raise OSError(errno.ENOSPC, "No space left on device", dst)
        return real_link(src, dst, *a, **k)
    monkeypatch.setattr(os, "link", link)
    calls: list = []
    f = fields_for(1)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        e = s.get_or_build(compute_key(f), f, builder(b"\x7fELF-full", calls))
    assert calls == [1] and e.files["kernel.so"].read_bytes() == b"\x7fELF-full"
    assert not str(e.layer).startswith(str(root))
    assert len(cache_warnings(w, "No space left")) == 1
    assert list((root / "v1" / "staging").iterdir()) == []
    assert [p.stem for p in (root / "v1" / "ac").rglob("*.json")] == [key0]
    assert s.lookup(compute_key(f)) is not None and s.lookup(key0) is not None


def test_foreign_writable_dir_refused(tmp_path, monkeypatch):
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, 0o777)
    with pytest.raises(CacheSecurityError) as ei:
        Store(root, layers=[])
    msg = str(ei.value)
    assert str(root) in msg and "0777" in msg and "world-writable" in msg
    assert "DSV4_JIT_ALLOW_SHARED_CACHE=1" in msg and "allow_shared=True" in msg
    assert not (root / "v1").exists()
    assert Store(root, layers=[], allow_shared=True).writable is not None
    monkeypatch.setenv("DSV4_JIT_ALLOW_SHARED_CACHE", "1")
    assert Store(root, layers=[]).writable is not None


def test_group_writable_and_foreign_owner_refused(tmp_path):
    g = tmp_path / "g"
    g.mkdir()
    os.chmod(g, 0o770)
    with pytest.raises(CacheSecurityError, match="group-writable"):
        Store(g, layers=[])
    if os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    os.chown(other, 12345, 12345)
    with pytest.raises(CacheSecurityError, match="owned by uid 12345"):
        Store(other, layers=[])
    # read-only layers: owner must be the caller or root, never group/world-writable
    base = tmp_path / "base"
    put(Store(base, layers=[]))
    os.chown(base, 12345, 12345)
    with pytest.raises(CacheSecurityError, match="read-only cache layer"):
        Store(tmp_path / "rw", layers=[base])
    os.chown(base, 0, 0)
    os.chmod(base / "v1", 0o777)
    with pytest.raises(CacheSecurityError, match="world-writable"):
        Store(tmp_path / "rw", layers=[base])
    assert Store(tmp_path / "rw", layers=[base], allow_shared=True).read_only


def test_errors_are_dsv4_errors():
    assert issubclass(CacheSecurityError, Dsv4JitError) and issubclass(KeyFieldError, Dsv4JitError)


# ------------------------------------------------------- prune, stats, clear
def test_prune_evicts_least_recently_used(tmp_path):
    root = tmp_path / "c"
    s = Store(root, layers=[])
    keys = [put(s, i, size=1000)[0] for i in range(3)]
    total = s.stats()["layers"][0]["bytes"]  # 3 x 1000 B + one shared kernel.cu blob
    for k, t in zip(keys, (1000, 2000, 3000)):
        os.utime(root / "v1" / "stamps" / k, (t, t))
    s2 = Store(root, layers=[])
    assert s2.lookup(keys[0]) is not None       # a hit refreshes the last-used stamp
    r = s2.prune(total - 1000)
    assert r["evicted"] == [keys[1]] and r["bytes_after"] == total - 1000
    # (checked via entries(): a lookup would refresh the stamps under test)
    assert sorted(e.key for e in s2.entries()) == sorted([keys[0], keys[2]])
    r = s2.prune(total - 2000)
    assert r["evicted"] == [keys[2]]
    assert [e.key for e in s2.entries()] == [keys[0]]
    assert s2.verify()["bad"] == []


def test_prune_keeps_blobs_still_referenced(tmp_path):
    s = Store(tmp_path / "c", layers=[])
    shared = os.urandom(3000)
    keys = []
    for i in range(2):
        f = fields_for(i)
        keys.append(compute_key(f))

        def build(st: Path, i=i):
            (st / "kernel.so").write_bytes(shared)         # same bytes: one blob for both entries
            (st / "uniq.bin").write_bytes(os.urandom(1000))
        s.get_or_build(keys[-1], f, build)
    total = s.stats()["layers"][0]["bytes"]
    assert total == 5000
    os.utime(tmp_path / "c" / "v1" / "stamps" / keys[0], (1, 1))
    r = s.prune(total - 1)
    assert r["evicted"] == [keys[0]] and r["bytes_after"] == 4000
    assert s.lookup(keys[1]).files["kernel.so"].read_bytes() == shared


def test_stats_counts_and_flush(tmp_path):
    root = tmp_path / "c"
    s = Store(root, layers=[])
    key, e = put(s, size=2000)                 # 1 miss (then built)
    s.lookup(key)
    s.lookup(key)
    s.lookup(compute_key(fields_for(5)))       # miss
    st = s.stats()["layers"][0]
    assert (st["entries"], st["hits"], st["misses"], st["quarantined"]) == (1, 2, 2, 0)
    assert st["bytes"] == e.size
    s.flush_stats()
    data = json.loads((root / "v1" / "stats.json").read_text())
    assert data["layers"]["writable"]["hits"] == 2
    s2 = Store(root, layers=[])
    s2.lookup(key)
    s2.flush_stats()
    s.flush_stats()                            # nothing new: no double counting
    assert Store(root, layers=[]).stats()["layers"][0]["hits"] == 3


def test_clear_and_entries(tmp_path):
    base = tmp_path / "base"
    bkey, _ = put(Store(base, layers=[]), 7)
    s = Store(tmp_path / "c", layers=[base])
    keys = {put(s, i)[0] for i in range(3)}
    assert {e.key for e in s.entries("writable")} == keys
    assert {e.key for e in s.entries(base)} == {bkey}
    assert {e.key for e in s.entries()} == keys | {bkey}
    with pytest.raises(CacheError, match="not a layer"):
        list(s.entries(tmp_path / "nope"))
    r = s.clear()
    assert r["entries_removed"] == 3
    assert [e.key for e in s.entries()] == [bkey]
    assert s.lookup(bkey) is not None  # read-only layers are never cleared


def test_a_build_waited_for_counts_as_a_hit_not_a_miss(tmp_path):
    """Two processes missing one key: the one that builds counts the miss, the one that waited on the
    per-key lock and got the built entry counts a hit, so `cache stats` misses equal builds."""
    root = tmp_path / "c"
    f = fields_for()
    key = compute_key(f)
    waiter = Store(root, layers=[])
    builder_store = Store(root, layers=[])
    calls: list = []

    def must_not_build(staging):
        raise AssertionError("the waiter must not build")
    real_lookup = waiter._lookup
    first = []

    def lookup(k, *, count):
        e = real_lookup(k, count=count)
        if not first:   # the waiter's first look finds nothing; the peer publishes before the waiter locks
            first.append(1)
            builder_store.get_or_build(key, f, builder(b"\x7fELF-peer", calls))
        return e
    waiter._lookup = lookup
    e = waiter.get_or_build(key, f, must_not_build)
    assert e.files["kernel.so"].read_bytes() == b"\x7fELF-peer" and calls == [1]
    waiter.flush_stats()
    builder_store.flush_stats()
    st = Store(root, layers=[]).stats()["layers"][0]
    assert (st["hits"], st["misses"]) == (1, 1)
