"""python -m concord --includedir | --libdir | --pkgconfigdir | --version

Where the installed package keeps the C header, libconcord.so and concord.pc,
for C, C++ and Rust builds against the same library the Python package uses:

    cc app.c -I"$(python -m concord --includedir)" -L"$(python -m concord --libdir)" \\
        -Wl,-rpath,"$(python -m concord --libdir)" -lconcord
    PKG_CONFIG_PATH=$(python -m concord --pkgconfigdir) pkg-config --cflags --libs concord
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import concord

_PACKAGE_DIR = Path(__file__).resolve().parent
_DIRECTORIES = {
    "includedir": _PACKAGE_DIR / "include",
    "libdir": _PACKAGE_DIR / "lib",
    "pkgconfigdir": _PACKAGE_DIR / "lib" / "pkgconfig",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m concord", description="Where concord's C header and library are installed.")
    choice = parser.add_mutually_exclusive_group(required=True)
    choice.add_argument("--includedir", action="store_true",
                        help="directory to pass to -I (holds concord/concord.h)")
    choice.add_argument("--libdir", action="store_true", help="directory of libconcord.so")
    choice.add_argument("--pkgconfigdir", action="store_true",
                        help="directory of concord.pc, for PKG_CONFIG_PATH")
    choice.add_argument("--version", action="store_true", help="concord's version")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.version:
        print(concord.__version__)
        return 0
    name = next(name for name in _DIRECTORIES if getattr(args, name))
    directory = _DIRECTORIES[name]
    if not directory.is_dir():
        print(f"python -m concord: {directory} does not exist; "
              "is concord installed (not run from its source tree)?", file=sys.stderr)
        return 1
    print(directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
