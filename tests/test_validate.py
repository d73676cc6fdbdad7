"""The shared argument checks (dsv4_jit.validate): every failure is a ValueError that names the argument."""
from __future__ import annotations

import sys
import subprocess

import pytest

from dsv4_jit.validate import int_arg, int_param


@pytest.mark.parametrize("kw, value, match", [
    ({}, 0, r"^k_name: n must be an int >= 1, got 0$"),
    ({}, True, r"^k_name: n must be an int >= 1, got True$"),
    ({}, 4.0, r"^k_name: n must be an int >= 1, got 4\.0$"),
    ({"lo": 4, "hi": 8}, 9, r"^k_name: n must be an int in \[4, 8\], got 9$"),
    ({"multiple": 128}, 100, r"^k_name: n must be a positive multiple of 128, got 100$"),
    ({"multiple": 128}, 0, r"^k_name: n must be a positive multiple of 128, got 0$"),
    ({"lo": 256, "multiple": 128}, 128, r"^k_name: n must be a multiple of 128 >= 256, got 128$"),
    ({"allowed": (16, 64)}, 32, r"^k_name: n=32 is not supported \(supported: \[16, 64\]\)$"),
])
def test_int_param_names_kernel_and_key(kw, value, match):
    with pytest.raises(ValueError, match=match):
        int_param("k_name", {"n": value}, "n", **kw)


def test_int_param_returns_the_value_and_names_a_missing_key():
    assert int_param("k", {"n": 256}, "n", multiple=128) == 256
    assert int_param("k", {"n": 64}, "n", allowed=(16, 64), lo=16, hi=64) == 64
    with pytest.raises(ValueError, match=r"^k: static params lack 'n'$"):
        int_param("k", {"m": 1}, "n")
    with pytest.raises(ValueError, match=r"^k: static params lack 'n'$"):
        int_param("k", None, "n")


def test_int_arg_names_the_argument_first():
    assert int_arg("groups", 3) == 3
    with pytest.raises(ValueError, match=r"^groups must be an int >= 1, got 0$"):
        int_arg("groups", 0)
    with pytest.raises(ValueError, match=r"^my_op: ratio=8 is not supported \(supported: \[4, 128\]\)$"):
        int_arg("ratio", 8, op="my_op", allowed=(4, 128))
    with pytest.raises(ValueError, match=r"^n must be a positive multiple of 64, got 100$"):
        int_arg("n", 100, multiple=64)


def test_arch_check_names_the_op():
    from dsv4_jit.arch import check_arch, get_profile
    assert check_arch("op", get_profile("sm_120a")) is get_profile("sm_120a")
    with pytest.raises(ValueError, match=r"^my_op: arch must be an ArchProfile"):
        check_arch("my_op", "sm_120a")


def test_static_checks_import_no_torch():
    """select validates its statics here; selecting a variant must not need torch."""
    code = "import sys, dsv4_jit.validate; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
