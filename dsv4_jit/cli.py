"""`dsv4-jit` command line. Errors print one line and exit non-zero, never a traceback."""
from __future__ import annotations

import argparse
import json
import sys
from typing import NoReturn

from .errors import Dsv4JitError


def _add_info(sub) -> None:
    p = sub.add_parser("info", help="toolchain fingerprint, arch profiles and the cache location")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _run_info(args) -> int:
    from .arch import PROFILES, detect_arch
    from .toolchain import toolchain_fingerprint
    from .jit import default_store
    gpu = detect_arch()
    info = {
        "toolchain": toolchain_fingerprint(),
        "gpu_arch": gpu.name if gpu else None,
        "profiles": {n: {"family": p.family, "max_smem_per_block": p.max_smem_per_block, "mma": p.mma_path,
                         "pass_configs": p.pass_configs, "description": p.description} for n, p in PROFILES.items()},
        "cache_dir": str(default_store().root),
    }
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    for k, v in info["toolchain"].items():
        print(f"{k:14} {v}")
    print(f"{'gpu_arch':14} {info['gpu_arch'] or 'none (cross-compile only)'}")
    print(f"{'cache_dir':14} {info['cache_dir']}")
    print("\narch      family              smem/block  mma")
    for n, p in PROFILES.items():
        print(f"{n:9} {p.family:19} {p.max_smem_per_block:>10,}  {p.mma_path}")
    return 0


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line naming the command and where its help is (subcommands inherit this)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .cache_tools.cli import add_cache_parser
    from .warmup.cli import add_plan_parsers
    parser = _Parser(prog="dsv4-jit", description=(
        "Compile every DeepSeek V4 TileLang kernel an engine will request, before serving."))
    parser.add_argument("--version", action="version", version=f"dsv4-jit {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also show the compiler's own warnings (always kept in the cache's log dir)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    add_plan_parsers(sub)
    add_cache_parser(sub)
    _add_info(sub)
    return parser


def _one_line_warnings() -> None:
    """Our warnings (a degraded cache, a skipped layer) as one `dsv4-jit: warning:` line each."""
    import warnings
    plain = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if category.__module__.startswith("dsv4_jit") or str(message).startswith("dsv4-jit"):
            text = " ".join(str(message).split())
            text = text[len("dsv4-jit cache: "):] if text.startswith("dsv4-jit cache: ") else text
            print(f"dsv4-jit: warning: {text}", file=file or sys.stderr)
        else:
            plain(message, category, filename, lineno, file, line)
    warnings.showwarning = show


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _one_line_warnings()
    if args.verbose:
        import os
        os.environ["DSV4_JIT_VERBOSE"] = "1"  # read by warmup workers too
    try:
        if args.command == "info":
            return _run_info(args)
        if args.command == "cache":
            from .cache_tools.cli import run_cache
            return run_cache(args)
        from .warmup.cli import run_plan_command
        return run_plan_command(args)
    except Dsv4JitError as e:
        print(f"dsv4-jit: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("dsv4-jit: interrupted (finished work is kept in the cache)", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as e:  # a path the user gave that cannot be read or written
        where = f" ({e.filename})" if e.filename else ""
        print(f"dsv4-jit: error: {e.strerror or e}{where}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
