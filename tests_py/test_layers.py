"""libcore's layers point down: every #include of a libcore source names a
directory its layer may use (docs/architecture.dot draws the same graph),
and nothing in libcore includes the C ABI's headers."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBCORE = ROOT / "libcore"

# Layer -> the layers its sources may include (itself always).
ALLOWED = {
    "base": set(),
    "plugin": {"base"},
    "kernels": {"base", "plugin"},
    "rendezvous": {"base"},
    "comm": {"base", "kernels", "plugin", "rendezvous"},
    "dp": {"base", "comm", "kernels", "plugin"},
    "metrics": {"base", "kernels", "plugin"},
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def _sources():
    if not LIBCORE.is_dir():
        pytest.skip("the sources are not beside the tests (an installed package only)")
    return sorted(p for p in LIBCORE.rglob("*") if p.suffix in {".hpp", ".cpp", ".cu", ".cuh", ".h"})


def _layer(path):
    return path.relative_to(LIBCORE).parts[0]


def test_every_libcore_include_points_down():
    wrong = []
    for source in _sources():
        layer = _layer(source)
        for target in INCLUDE.findall(source.read_text()):
            top = target.split("/")[0]
            if "/" not in target or top == layer:
                continue
            if top not in ALLOWED or top not in ALLOWED[layer]:
                wrong.append(f"{source.relative_to(ROOT)} ({layer}) includes {target}")
    assert not wrong, "includes against the layering:\n" + "\n".join(wrong)


def test_the_layers_are_the_directories():
    assert {p.name for p in LIBCORE.iterdir() if p.is_dir()} == set(ALLOWED)


def test_the_allowed_graph_has_no_cycle():
    seen, done = set(), set()

    def visit(layer, path):
        assert layer not in seen or layer in done, f"cycle: {' -> '.join(path)}"
        if layer in done:
            return
        seen.add(layer)
        for lower in ALLOWED[layer]:
            visit(lower, path + [lower])
        done.add(layer)

    for layer in ALLOWED:
        visit(layer, [layer])
