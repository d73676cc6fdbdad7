"""Minimal `dsv4-jit` entry point (the lead owns this file; it wires in `cache` for now)."""
from __future__ import annotations

import argparse
import sys

from .errors import Dsv4JitError


def build_parser() -> argparse.ArgumentParser:
    from .cache_tools.cli import add_cache_parser
    parser = argparse.ArgumentParser(prog="dsv4-jit", description="DeepSeek V4 TileLang kernels, compiled ahead of serving.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    add_cache_parser(sub)
    from .warmup.cli import add_plan_parsers
    add_plan_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "cache":
            from .cache_tools.cli import run_cache
            return run_cache(args)
        if args.command in ("plan", "check", "warmup"):
            from .warmup.cli import run_plan_command
            return run_plan_command(args)
        return 2
    except Dsv4JitError as e:
        print(f"dsv4-jit: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("dsv4-jit: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
