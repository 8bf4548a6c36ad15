"""examples/c/allreduce.c builds against the installed header and library
and runs alone and under the launcher."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import concord_main

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "c" / "allreduce.c"
# The example must stay warning-free, strict C99 against the public header.
CFLAGS = ["-std=c99", "-pedantic", "-Wall", "-Wextra", "-Werror"]

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")


def _compile(output: Path, flags: list[str]) -> Path:
    result = subprocess.run(["cc", *CFLAGS, "-o", str(output), str(EXAMPLE), *flags],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return output


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> Path:
    libdir = concord_main("--libdir")
    includedir = concord_main("--includedir")
    flags = [f"-I{includedir}", f"-L{libdir}", f"-Wl,-rpath,{libdir}", "-lconcord"]
    return _compile(tmp_path_factory.mktemp("c_example") / "allreduce", flags)


def _run(command: list[str]) -> subprocess.CompletedProcess:
    # Without rendezvous variables (conftest.py clears them) the example is
    # a world of one.
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_runs_alone_as_a_world_of_one(example):
    result = _run([str(example), "1000"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["rank 0: all_reduce of 1000 floats verified"]


@pytest.mark.parametrize("count", [0, 1000003])
def test_runs_under_the_launcher(example, count):
    result = _run([sys.executable, "-m", "concord.run", "-n", "3", str(example), str(count)])
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [
        f"[{rank}] rank {rank}: all_reduce of {count} floats verified" for rank in range(3)]


def test_rejects_a_bad_count(example):
    result = _run([str(example), "many"])
    assert result.returncode == 2 and "usage" in result.stderr


@pytest.mark.skipif(shutil.which("pkg-config") is None, reason="needs pkg-config")
def test_compiles_with_pkg_config(tmp_path):
    env = os.environ | {"PKG_CONFIG_PATH": concord_main("--pkgconfigdir")}
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "concord"], env=env,
                           capture_output=True, text=True, timeout=60, check=True).stdout.split()
    binary = _compile(tmp_path / "allreduce", flags)
    result = _run([str(binary), "10"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["rank 0: all_reduce of 10 floats verified"]
