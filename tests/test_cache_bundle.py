"""Export/import bundles: round trip, filters, fingerprints, and every malformed bundle refused."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
import warnings
from pathlib import Path

import pytest

from dsv4_jit.cache_tools import BundleError, CacheWarning, Store, compute_key, export_bundle, import_bundle
from dsv4_jit.cache_tools import store as store_mod

FP = {"tilelang": "0.1.15", "tilelang_libs": "ab" * 32, "nvcc": "12.8.93", "host_abi": "tvm_ffi-0.1-linux-x86_64"}


pytestmark = pytest.mark.usefixtures("isolated_cache")


SPECS = [("mhc_pre", "sm_90a", 0), ("mhc_pre", "sm_120a", 1), ("mhc_post", "sm_90a", 2)]


@pytest.fixture
def src_store(tmp_path) -> Store:
    s = Store(tmp_path / "src", layers=[])
    for kernel, arch, i in SPECS:
        f = {"kernel": kernel, "arch": arch, "variant": i}

        def build(st: Path, i=i):
            (st / "kernel.so").write_bytes(b"\x7fELF" + os.urandom(20_000 + i))
            (st / "kernel.cu").write_text(f"// variant {i}\n")
            return {"smem_bytes": 1000 * (i + 1)}
        s.get_or_build(compute_key(f), f, build)
    return s


def tree(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


def content(store: Store) -> dict:
    return {e.key: (e.fields, e.extra, {n: p.read_bytes() for n, p in e.files.items()}) for e in store.entries()}


def test_export_import_round_trip(src_store, tmp_path):
    out = tmp_path / "out" / "bundle.tar.gz"
    cov = {"plan": "vllm-default", "keys": sorted(e.key for e in src_store.entries())}
    r = export_bundle(src_store, str(out), FP, coverage=cov)
    assert r["entries"] == 3 and out.exists() and r["archs"] == ["sm_120a", "sm_90a"]
    assert [p.name for p in out.parent.iterdir()] == ["bundle.tar.gz"]  # no temp file left
    dst = Store(tmp_path / "dst", layers=[])
    ri = import_bundle(dst, str(out), FP)
    assert (ri["installed"], ri["already_present"], ri["fingerprint_match"]) == (3, 0, True)
    assert ri["bytes"] > 60_000 and ri["seconds"] > 0 and ri["mb_per_s"] > 0 and ri["coverage"] == cov
    assert content(dst) == content(src_store)
    for e in dst.entries():
        assert e.imported and e.manifest["origin"]["bundle_producer"] == FP
        assert dst.lookup(e.key) is not None
    ri2 = import_bundle(dst, out, FP)  # idempotent
    assert (ri2["installed"], ri2["already_present"]) == (0, 3)
    # same entries give the same bundle bytes (stable member order and metadata), modulo `created`
    assert dst.verify()["bad"] == []


def test_export_filters_and_import_merges(src_store, tmp_path):
    b90 = tmp_path / "b90.tar.gz"
    assert export_bundle(src_store, b90, FP, archs=["sm90"])["entries"] == 2  # alias normalised
    bpost = tmp_path / "bpost.tar.gz"
    assert export_bundle(src_store, bpost, FP, kernels=["mhc_post"])["entries"] == 1
    keys = sorted(e.key for e in src_store.entries())
    bkeys = tmp_path / "bkeys.tar.gz"
    assert export_bundle(src_store, bkeys, FP, keys=keys[:1] + ["not-in-the-store"])["entries"] == 1
    assert export_bundle(src_store, bkeys, FP, keys=[])["entries"] == 0
    dst = Store(tmp_path / "dst", layers=[])
    assert import_bundle(dst, bpost, FP)["installed"] == 1
    r = import_bundle(dst, b90, FP)
    assert (r["installed"], r["already_present"]) == (1, 1)
    assert {e.fields["arch"] for e in dst.entries()} == {"sm_90a"} and len(list(dst.entries())) == 2


def test_imported_entry_is_hashed_on_first_read(src_store, tmp_path):
    out = tmp_path / "b.tar.gz"
    export_bundle(src_store, out, FP)
    dst = Store(tmp_path / "dst", layers=[])
    import_bundle(dst, out, FP)
    keys = sorted(e.key for e in dst.entries())
    bad = next(e for e in dst.entries() if e.key == keys[0])
    p = bad.files["kernel.so"]
    os.chmod(p, 0o644)
    data = bytearray(p.read_bytes())
    data[100] ^= 1
    p.write_bytes(bytes(data))
    with pytest.warns(CacheWarning, match="sha256 mismatch"):
        assert dst.lookup(keys[0]) is None
    good = dst.lookup(keys[1])
    assert good is not None
    m = json.loads((tmp_path / "dst" / "v1" / "ac" / keys[1][:2] / f"{keys[1]}.json").read_text())
    assert m["imported"] is True and m["verified"] > 0  # recorded once, in the manifest itself
    store_mod._verified.clear()  # a new process trusts the record instead of re-hashing
    calls = []
    real = store_mod._hash_mismatches
    store_mod._hash_mismatches = lambda *a: calls.append(1) or real(*a)
    try:
        assert Store(tmp_path / "dst", layers=[]).lookup(keys[1]) is not None
    finally:
        store_mod._hash_mismatches = real
    assert calls == []


def test_fingerprint_mismatch_refused_then_forced(src_store, tmp_path):
    out = tmp_path / "b.tar.gz"
    export_bundle(src_store, out, {**FP, "nvcc": "13.0.88"})
    dst = Store(tmp_path / "dst", layers=[])
    before = tree(tmp_path / "dst")
    with pytest.raises(BundleError) as ei:
        import_bundle(dst, out, FP)
    assert "nvcc: bundle '13.0.88' vs here '12.8.93'" in str(ei.value) and "--force" in str(ei.value)
    assert tree(tmp_path / "dst") == before
    r = import_bundle(dst, out, FP, force=True)
    assert r["installed"] == 3 and r["forced"] and not r["fingerprint_match"]
    assert any("will not match" in n for n in r["notes"])


def test_export_import_via_fsspec_url(src_store, tmp_path):
    pytest.importorskip("fsspec")
    url = "memory://dsv4-test/bundle.tar.gz"
    export_bundle(src_store, url, FP)
    dst = Store(tmp_path / "dst", layers=[])
    assert import_bundle(dst, url, FP)["installed"] == 3
    assert content(dst) == content(src_store)


def test_xz_bundle_by_suffix(src_store, tmp_path):
    out = tmp_path / "b.tar.xz"
    export_bundle(src_store, out, FP)
    assert out.read_bytes()[:6] == b"\xfd7zXZ\x00"
    dst = Store(tmp_path / "dst", layers=[])
    assert import_bundle(dst, out, FP)["installed"] == 3


def test_import_into_read_only_cache_is_memory_only(src_store, tmp_path, monkeypatch):
    out = tmp_path / "b.tar.gz"
    export_bundle(src_store, out, FP)
    import errno
    real_mkdir, real_open = os.mkdir, os.open
    ro = str(tmp_path / "ro")

    def mkdir(p, *a, **k):
        if os.fsdecode(p).startswith(ro):
            raise OSError(errno.EROFS, "Read-only file system", p)
        return real_mkdir(p, *a, **k)

    def open_(p, flags, *a, **k):
        if os.fsdecode(p).startswith(ro) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, "Read-only file system", p)
        return real_open(p, flags, *a, **k)
    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(os, "open", open_)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        dst = Store(tmp_path / "ro" / "cache", layers=[])
        r = import_bundle(dst, out, FP)
    assert r["installed"] == 3 and any("temp dir" in n for n in r["notes"])
    assert all(dst.lookup(e.key) is not None for e in src_store.entries())


# ------------------------------------------------------------ malformed bundles
def _bundle_parts(src_store: Store) -> tuple[dict, dict[str, bytes]]:
    """A valid manifest and blobs to tamper with."""
    entries, blobs = [], {}
    for e in sorted(src_store.entries(), key=lambda e: e.key):
        entries.append({"key": e.key, "fields": e.fields, "files": e.manifest["files"], "extra": e.extra,
                        "created": 1.0, "producer": {}})
        for n, i in e.manifest["files"].items():
            blobs[i["sha256"]] = e.files[n].read_bytes()
    m = {"format_version": 1, "kind": "dsv4-jit-cache-bundle", "producer": FP, "archs": [],
         "entries": entries, "blobs": {k: len(v) for k, v in sorted(blobs.items())},
         "total_bytes": sum(map(len, blobs.values())), "coverage": None}
    return m, blobs


def _write(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]], trailing: bytes = b"") -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for ti, data in members:
            tar.addfile(ti, io.BytesIO(data) if data is not None else None)
    path.write_bytes(gzip.compress(buf.getvalue() + trailing))
    return path


def _reg(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    return ti, data


def _special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, None]:
    ti = tarfile.TarInfo(name)
    ti.type, ti.linkname = kind, linkname
    return ti, None


def _standard(m: dict, blobs: dict[str, bytes]) -> list:
    return [_reg("manifest.json", json.dumps(m).encode())] + [_reg(f"blobs/{k}", v) for k, v in blobs.items()]


def _cases(src_store: Store) -> dict:
    m, blobs = _bundle_parts(src_store)
    first = next(iter(blobs))
    mj = _reg("manifest.json", json.dumps(m).encode())
    rest = [_reg(f"blobs/{k}", v) for k, v in blobs.items()]

    def with_manifest(mod):
        mm = json.loads(json.dumps(m))
        mod(mm)
        return [_reg("manifest.json", json.dumps(mm).encode())] + rest

    flipped = bytearray(blobs[first])
    flipped[5] ^= 0xFF
    cases = {
        "traversal": ([mj] + rest + [_reg("blobs/../../evil.so", b"x")], "'..'"),
        "absolute": ([mj] + rest + [_reg("/etc/evil.so", b"x")], "absolute path"),
        "symlink": ([mj] + rest + [_special("blobs/link", tarfile.SYMTYPE, "/etc/passwd")], "symbolic link"),
        "hardlink": ([mj] + rest + [_special("blobs/hard", tarfile.LNKTYPE, "manifest.json")], "hard link"),
        "fifo": ([mj] + rest + [_special("blobs/fifo", tarfile.FIFOTYPE)], "device or fifo"),
        "chardev": ([mj] + rest + [_special("blobs/dev", tarfile.CHRTYPE)], "device or fifo"),
        "directory": ([mj, _special("blobs", tarfile.DIRTYPE)] + rest, "is a directory"),
        "duplicate": ([mj] + rest + [rest[0]], "duplicate member"),
        "hash_mismatch": ([mj] + [_reg(f"blobs/{first}", bytes(flipped))] + rest[1:], "sha256"),
        "size_mismatch": ([mj] + [_reg(f"blobs/{first}", blobs[first] + b"x")] + rest[1:], "bytes, manifest says"),
        "unknown_format": (with_manifest(lambda mm: mm.update(format_version=99)), "format_version 99"),
        "not_listed": ([mj] + rest + [_reg("blobs/" + "0" * 64, b"extra")], "not listed"),
        "missing": ([mj] + rest[1:], "missing"),
        "manifest_not_first": (rest + [mj], "first member"),
        "unsafe_entry_name": (with_manifest(lambda mm: mm["entries"][0]["files"].update(
            {"../../x.so": mm["entries"][0]["files"]["kernel.so"]})), "unsafe file name"),
        "entry_blob_mismatch": (with_manifest(lambda mm: mm["entries"][0]["files"]["kernel.so"].update(size=1)),
                                "does not match a listed blob"),
        "bad_json": ([_reg("manifest.json", b"{not json")] + rest, "not valid JSON"),
    }
    return cases


def test_every_malformed_bundle_is_refused_with_nothing_written(src_store, tmp_path):
    dst_root = tmp_path / "dst"
    dst = Store(dst_root, layers=[])
    existing_f = {"kernel": "keep", "arch": "sm_90a"}
    def build(st: Path) -> None:
        (st / "k.so").write_bytes(b"keep")
    dst.get_or_build(compute_key(existing_f), existing_f, build)
    before = tree(dst_root)
    for name, (members, needle) in _cases(src_store).items():
        path = _write(tmp_path / f"{name}.tar.gz", members)
        with pytest.raises(BundleError) as ei:
            import_bundle(dst, path, FP)
        assert needle in str(ei.value), f"{name}: {ei.value}"
        assert tree(dst_root) == before, f"{name} left files behind"
    # not an archive at all / truncated
    (tmp_path / "junk.tar.gz").write_bytes(b"PK\x03\x04 not a bundle")
    good = tmp_path / "good.tar.gz"
    export_bundle(src_store, good, FP)
    (tmp_path / "trunc.tar.gz").write_bytes(good.read_bytes()[:-200])
    for bad, needle in (("junk.tar.gz", "gzip- or xz"), ("trunc.tar.gz", "corrupt or truncated"),
                        ("does-not-exist.tar.gz", "not found")):
        with pytest.raises(BundleError, match=needle):
            import_bundle(dst, tmp_path / bad, FP)
        assert tree(dst_root) == before
    assert import_bundle(dst, good, FP)["installed"] == 3  # and a good one still goes in


def test_decompression_bomb_is_refused(src_store, tmp_path):
    m, blobs = _bundle_parts(src_store)
    # A valid bundle followed by 64 MiB of zeros: ~64 KiB on disk, far beyond what the manifest declares.
    path = _write(tmp_path / "bomb.tar.gz", _standard(m, blobs), trailing=b"\0" * (64 << 20))
    assert path.stat().st_size < 1 << 20
    dst = Store(tmp_path / "dst", layers=[])
    before = tree(tmp_path / "dst")
    with pytest.raises(BundleError, match="expands past"):
        import_bundle(dst, path, FP)
    assert tree(tmp_path / "dst") == before
    # a huge member that claims a huge size is refused before any of it is read
    m2 = json.loads(json.dumps(m))
    ti, _ = _reg("blobs/" + "1" * 64, b"")
    ti.size = 1 << 40
    mj = json.dumps(m2).encode()
    t0, _ = _reg("manifest.json", mj)
    raw = t0.tobuf(format=tarfile.GNU_FORMAT) + mj + b"\0" * (-len(mj) % 512) + ti.tobuf(format=tarfile.GNU_FORMAT)
    (tmp_path / "huge.tar.gz").write_bytes(gzip.compress(raw))
    with pytest.raises(BundleError, match="not listed"):
        import_bundle(dst, tmp_path / "huge.tar.gz", FP)
    assert tree(tmp_path / "dst") == before


def test_export_skips_corrupt_entries(src_store, tmp_path):
    e = next(iter(src_store.entries()))
    p = e.files["kernel.so"]
    os.chmod(p, 0o644)
    p.write_bytes(b"\x7fELF" + b"\0" * (p.stat().st_size - 4))
    with pytest.warns(CacheWarning):
        r = export_bundle(src_store, tmp_path / "b.tar.gz", FP)
    assert r["entries"] == 2 and r["skipped_corrupt"] == [e.key]
