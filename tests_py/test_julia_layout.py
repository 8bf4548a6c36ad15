"""docs/julia.md's numbers against the C compiler: the size and field
offsets of each struct it mirrors, the defaults its constructors fill in
place of the _INIT macros, and its constants. tests_cpp/test_julia_layout.c
asserts the layouts at compile time and prints all of them; this test reads
the document and compares, so the two cannot drift apart."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import concord_main

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "julia.md"
C_TEST = ROOT / "tests_cpp" / "test_julia_layout.c"

STRUCT = re.compile(r"^struct (\w+)\s+# (\w+): (\d+) bytes$")
FIELD = re.compile(r"^\s+(\w+)::\S+\s+# (\d+)$")
CONSTRUCTOR = re.compile(r"^(\w+)\(; (.*)\) =$")
CONSTANT = re.compile(r"^const (\w+) = (?:Cint|UInt8)\((-?\d+)\)$")


def julia_code() -> list[str]:
    """The lines of the document's Julia code blocks."""
    return [line for block in re.findall(r"```julia\n(.*?)```", DOC.read_text(), re.S)
            for line in block.splitlines()]


def documented():
    """(layout lines as the C test prints them, constructor defaults by
    (C struct, field), constants by name, Julia name -> C name)."""
    layout, defaults, constants, c_name = set(), {}, {}, {}
    current = None
    for line in julia_code():
        if match := STRUCT.match(line):
            julia, current, size = match.groups()
            c_name[julia] = current
            layout.add(f"{current} size {size}")
        elif current and (match := FIELD.match(line)):
            layout.add(f"{current}.{match[1]} offset {match[2]}")
        elif line == "end":
            current = None
        elif match := CONSTANT.match(line):
            constants[match[1]] = int(match[2])
        elif match := CONSTRUCTOR.match(line):
            for pair in match[2].split(", "):
                field, value = pair.split(" = ")
                defaults[(match[1], field)] = value
    defaults = {(c_name[julia], field): value for (julia, field), value in defaults.items()}
    return layout, defaults, constants, c_name


@pytest.fixture(scope="module")
def c_lines(tmp_path_factory) -> list[str]:
    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler (cc)")
    binary = tmp_path_factory.mktemp("julia_layout") / "julia_layout"
    built = subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror",
                            f"-I{concord_main('--includedir')}", "-o", str(binary), str(C_TEST)],
                           capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    return subprocess.run([str(binary)], capture_output=True, text=True, timeout=60,
                          check=True).stdout.splitlines()


def test_every_struct_size_and_offset_is_the_c_compilers(c_lines):
    layout, _, _, c_name = documented()
    assert len(c_name) == 8, c_name
    c_layout = {line for line in c_lines if " size " in line or " offset " in line}
    assert layout == c_layout, (f"only in docs/julia.md: {sorted(layout - c_layout)}\n"
                                f"only in C: {sorted(c_layout - layout)}")


def _value(text: str, layout: set[str], constants: dict[str, int], c_name: dict[str, str]):
    """A constructor default as the C test prints it."""
    if text == "C_NULL":
        return "NULL"
    if match := re.fullmatch(r"sizeof\((\w+)\)", text):
        size = next(line for line in layout if line.startswith(f"{c_name[match[1]]} size "))
        return float(size.rsplit(" ", 1)[1])
    if text in constants:
        return float(constants[text])
    return float(text)


def test_constructor_defaults_are_the_init_macros(c_lines):
    layout, defaults, constants, c_name = documented()
    c_defaults = {}
    for line in c_lines:
        if " default " in line:
            key, value = line.split(" default ")
            struct, field = key.split(".")
            c_defaults[(struct, field)] = value if value == "NULL" else float(value)
    assert set(defaults) == set(c_defaults)
    for key, text in defaults.items():
        assert _value(text, layout, constants, c_name) == c_defaults[key], (key, text)


def test_constants_are_the_headers(c_lines):
    _, _, constants, _ = documented()
    c_constants = {name: int(value) for name, value in
                   (line.split(" = ") for line in c_lines if " = " in line)}
    assert constants == c_constants
