"""examples/rust/allreduce.rs, a Rust program using only the C ABI (no
crates), builds against the installed library and runs alone and under the
launcher."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import concord_main

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "rust" / "allreduce.rs"

pytestmark = pytest.mark.skipif(shutil.which("rustc") is None, reason="needs rustc")


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> Path:
    libdir = concord_main("--libdir")
    output = tmp_path_factory.mktemp("rust_example") / "allreduce"
    result = subprocess.run(
        ["rustc", "-O", "--edition", "2021", "-D", "warnings", str(EXAMPLE), "-o", str(output),
         "-L", libdir, "-l", "concord", "-C", f"link-arg=-Wl,-rpath,{libdir}"],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return output


def test_runs_alone_as_a_world_of_one(example):
    result = subprocess.run([str(example), "1000"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["rank 0: all_reduce of 1000 floats verified from Rust"]


def test_runs_under_the_launcher(example):
    result = subprocess.run([sys.executable, "-m", "concord.run", "-n", "3", str(example), "100003"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [
        f"[{rank}] rank {rank}: all_reduce of 100003 floats verified from Rust" for rank in range(3)]


def test_a_bad_argument_is_reported(example):
    result = subprocess.run([str(example), "many"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.startswith("usage: allreduce [count]")
