"""`python -m dsv4_jit cache ...` in real subprocesses: JSON output, exit codes, one-line errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4_jit.cache_tools import CacheError, Store, compute_key
from dsv4_jit.cache_tools.cli import human_bytes, parse_size, table

pytestmark = pytest.mark.usefixtures("isolated_cache")


def cli(tmp_path: Path, *args: str, cache: Path | None = None, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSV4_JIT_")}
    env.update(DSV4_JIT_CACHE_DIR=str(cache or tmp_path / "cache"), XDG_CACHE_HOME=str(tmp_path / "xdg"))
    return subprocess.run([sys.executable, "-m", "dsv4_jit", "cache", *args], env=env, text=True,
                          capture_output=True, input=stdin if stdin is not None else "", timeout=120)


def ok_json(r: subprocess.CompletedProcess) -> dict:
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def one_line_error(r: subprocess.CompletedProcess, needle: str) -> None:
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("dsv4-jit: error: ") and needle in lines[0], r.stderr


def populate(root: Path, n: int = 3) -> list[str]:
    s = Store(root, layers=[])
    keys = []
    for i in range(n):
        f = {"kernel": "mhc_post" if i % 2 else "mhc_pre", "arch": "sm_90a", "variant": i}
        keys.append(compute_key(f))

        def build(st: Path, i=i):
            (st / "kernel.so").write_bytes(b"\x7fELF" + os.urandom(3000 + i))
            return {"smem_bytes": 4096 * (i + 1)}
        s.get_or_build(keys[-1], f, build)
    s.flush_stats()
    return keys


def test_parse_size_and_formatting():
    assert parse_size("10G") == 10 << 30 and parse_size("500M") == 500 << 20
    assert parse_size("4096") == 4096 and parse_size("1.5GiB") == int(1.5 * (1 << 30)) and parse_size("2kb") == 2048
    for bad in ("10X", "", "-1G", "G"):
        with pytest.raises(CacheError, match="bad size"):
            parse_size(bad)
    assert human_bytes(1536) == "1.5 KiB"
    t = table(["A", "LONG"], [["xxxx", 1]]).splitlines()
    assert t[0] == "A     LONG" and t[2] == "xxxx  1"


def test_dir_ls_stats_verify(tmp_path):
    root = tmp_path / "cache"
    d = ok_json(cli(tmp_path, "dir", "--json"))
    assert d["writable"] == str(root) and not d["memory_only"]
    keys = populate(root)
    ls = ok_json(cli(tmp_path, "ls", "--json"))
    assert ls["count"] == 3 and sorted(e["key"] for e in ls["entries"]) == sorted(keys)
    assert {e["kernel"] for e in ls["entries"]} == {"mhc_pre", "mhc_post"}
    assert all(e["extra"]["smem_bytes"] % 4096 == 0 for e in ls["entries"])
    human = cli(tmp_path, "ls")
    assert human.returncode == 0 and "KERNEL" in human.stdout and "3 entries" in human.stdout
    st = ok_json(cli(tmp_path, "stats", "--json"))["layers"][0]
    assert st["entries"] == 3 and st["misses"] == 3 and st["kind"] == "writable"
    v = ok_json(cli(tmp_path, "verify", "--json"))
    assert v["ok"] == 3 and v["bad"] == []
    # damage one blob: verify reports it, exits 1, and the entry is gone afterwards
    blob = next((root / "v1" / "blobs").rglob("*.so"))
    os.chmod(blob, 0o644)
    blob.write_bytes(b"\x7fELF" + b"\0" * (blob.stat().st_size - 4))
    r = cli(tmp_path, "verify", "--json")
    assert r.returncode == 1 and len(json.loads(r.stdout)["bad"]) == 1
    assert ok_json(cli(tmp_path, "ls", "--json"))["count"] == 2
    assert ok_json(cli(tmp_path, "stats", "--json"))["layers"][0]["quarantined"] == 1


def test_prune_clear(tmp_path):
    populate(tmp_path / "cache")
    # --max-size 0 empties the cache: like clear, it asks (no terminal: refuses) unless --yes
    one_line_error(cli(tmp_path, "prune", "--max-size", "0"), "pass --yes")
    assert ok_json(cli(tmp_path, "ls", "--json"))["count"] == 3
    assert ok_json(cli(tmp_path, "prune", "--max-size", "1M", "--json"))["evicted_count"] == 0  # no question
    p = ok_json(cli(tmp_path, "prune", "--max-size", "0", "--yes", "--json"))
    assert p["evicted_count"] == 3 and p["bytes_after"] == 0
    populate(tmp_path / "cache", 2)
    one_line_error(cli(tmp_path, "clear"), "--yes")  # no tty, no --yes: refuse
    assert ok_json(cli(tmp_path, "ls", "--json"))["count"] == 2
    c = ok_json(cli(tmp_path, "clear", "--yes", "--json"))
    assert c["cleared"] and c["entries_removed"] == 2
    assert ok_json(cli(tmp_path, "ls", "--json"))["count"] == 0


def test_export_import_cli(tmp_path):
    keys = populate(tmp_path / "cache")
    b = tmp_path / "bundle.tar.gz"
    e = ok_json(cli(tmp_path, "export", str(b), "--kernel", "mhc_pre", "--arch", "sm_90a", "--json"))
    assert e["entries"] == 2 and b.exists()
    other = tmp_path / "other"
    i = ok_json(cli(tmp_path, "import", str(b), "--json", cache=other))
    assert i["installed"] == i["persisted"] == 2 and i["fingerprint_match"] and i["mb_per_s"] is not None
    assert {x["key"] for x in ok_json(cli(tmp_path, "ls", "--json", cache=other))["entries"]} == {keys[0], keys[2]}
    human = cli(tmp_path, "import", str(b), cache=other)
    assert human.returncode == 0 and "2 already present" in human.stdout


def test_errors_are_one_line(tmp_path):
    one_line_error(cli(tmp_path, "import", str(tmp_path / "nope.tar.gz")), "bundle not found")
    one_line_error(cli(tmp_path, "prune", "--max-size", "10X"), "bad size")
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"garbage")
    one_line_error(cli(tmp_path, "import", str(bad)), "not a dsv4-jit bundle")
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    one_line_error(cli(tmp_path, "ls", cache=shared), "DSV4_JIT_ALLOW_SHARED_CACHE=1")
    r = cli(tmp_path, "frobnicate")
    assert r.returncode == 2 and "Traceback" not in r.stderr  # argparse usage error


# ---- an unwritable cache dir -----------------------------------------------------------------------

def _in_process(capsys, *argv: str) -> tuple[int, str, str]:
    from dsv4_jit.cli import main
    try:
        rc = main(["cache", *argv])
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_import_into_a_read_only_cache_fails_and_keeps_nothing(tmp_path, capsys, monkeypatch):
    import errno
    sys.path.insert(0, str(Path(__file__).parent))
    from test_cache_store import _deny_writes_under
    populate(tmp_path / "src")
    bundle = tmp_path / "b.tar.gz"
    ok_json(cli(tmp_path, "export", str(bundle), "--json", cache=tmp_path / "src"))
    baked = tmp_path / "baked"
    populate(baked, 1)                                  # a cache baked into an image, then mounted read-only
    _deny_writes_under(monkeypatch, baked, errno.EROFS)
    for argv in (["import", str(bundle)], ["import", str(bundle), "--json"]):
        rc, out, err = _in_process(capsys, *argv, "--cache-dir", str(baked))
        lines = err.strip().splitlines()
        assert rc == 1 and out == "" and len(lines) == 1, err
        assert lines[0].startswith("dsv4-jit: error: cannot import into the cache: cache dir ") and str(baked) in lines[0]
        assert "EROFS" in lines[0] and "nothing would be kept" in lines[0] and "DSV4_JIT_CACHE_DIR" in lines[0]
    # nothing reached the read-only dir; its one entry still serves
    monkeypatch.undo()
    assert ok_json(cli(tmp_path, "ls", "--json", cache=baked))["count"] == 1


@pytest.mark.parametrize("argv", [["clear", "--yes"], ["prune", "--max-size", "1G"]])
def test_clear_and_prune_of_an_unwritable_dir_say_so(tmp_path, argv):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    r = cli(tmp_path, *argv, cache=blocker / "cache")   # ENOTDIR: no cache can live there
    one_line_error(r, f"cannot {argv[0]} the cache: cache dir {blocker / 'cache'} is not writable")
    assert "None" not in r.stderr


def test_reading_commands_on_an_unwritable_dir_warn_in_one_line(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    r = cli(tmp_path, "stats", "--json", cache=blocker / "cache")
    assert r.returncode == 0 and json.loads(r.stdout)["memory_only"]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dsv4-jit: warning: cache dir ") and "DSV4_JIT_CACHE_DIR" in lines[0]


# ---- layers and where files go ------------------------------------------------------------------------

def test_unpacked_bundle_as_a_layer_is_named_and_a_layer_explained(tmp_path):
    import tarfile
    populate(tmp_path / "src")
    bundle = tmp_path / "b.tar.gz"
    ok_json(cli(tmp_path, "export", str(bundle), "--json", cache=tmp_path / "src"))
    unpacked = tmp_path / "unpacked"
    with tarfile.open(bundle) as t:
        t.extractall(unpacked, filter="data")
    env_layers = {"DSV4_JIT_CACHE_LAYERS": str(unpacked)}
    r = cli_env(tmp_path, env_layers, "ls")
    one_line_error(r, f"read-only layer {unpacked} is an unpacked bundle, not a cache dir")
    assert "v1/ac/" in r.stderr and "cache import" in r.stderr and "--cache-dir" in r.stderr
    # what the message says works: import the bundle into a dir, list that dir as the layer
    layer = tmp_path / "layer"
    ok_json(cli(tmp_path, "import", str(bundle), "--json", cache=layer))
    ls = ok_json(cli_env(tmp_path, {"DSV4_JIT_CACHE_LAYERS": str(layer)}, "ls", "--json"))
    assert ls["count"] == 3 and all(e["read_only"] for e in ls["entries"])
    # a dir that is no cache at all is skipped with one warning saying what a layer is
    r = cli_env(tmp_path, {"DSV4_JIT_CACHE_LAYERS": str(tmp_path / "empty")}, "ls", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["count"] == 0
    assert r.stderr.count("\n") == 1 and "is not a cache dir, ignoring it: a layer is a directory" in r.stderr


def cli_env(tmp_path: Path, extra: dict, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSV4_JIT_")}
    env.update(DSV4_JIT_CACHE_DIR=str(tmp_path / "cache"), XDG_CACHE_HOME=str(tmp_path / "xdg"), **extra)
    return subprocess.run([sys.executable, "-m", "dsv4_jit", "cache", *args], env=env, text=True,
                          capture_output=True, input="", timeout=120)


def test_everything_stays_under_the_chosen_cache_dir(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSV4_JIT_")}
    chosen = tmp_path / "chosen"
    env.update(DSV4_JIT_CACHE_DIR=str(chosen), XDG_CACHE_HOME=str(tmp_path / "xdg"), HOME=str(tmp_path / "home"))
    r = subprocess.run([sys.executable, "-m", "dsv4_jit", "info", "--json"], env=env, text=True,
                       capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["toolchain"]["tilelang_libs"]           # the fingerprint hashed the libraries
    assert (chosen / "memo" / "libhash.json").is_file()                 # and memoised that under the chosen dir
    assert not (tmp_path / "xdg").exists() and not (tmp_path / "home" / ".cache").exists()


def test_stats_count_one_miss_per_build(tmp_path):
    keys = populate(tmp_path / "cache", 4)
    s = Store(tmp_path / "cache", layers=[])
    for k in keys:                      # probes (planning, check) are not uses: nothing counted
        assert s.contains(k) and s.peek(k) is not None
    s.flush_stats()
    st = ok_json(cli(tmp_path, "stats", "--json"))["layers"][0]
    assert (st["hits"], st["misses"]) == (0, 4)
