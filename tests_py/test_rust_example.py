"""examples/rust, a program using the `concord` crate the way a user's does
(path dependencies, a build script for the rpath), builds with cargo against
the installed library and runs alone and under the launcher."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "rust"
# Shared with the workspace's `cargo test` (rust/.cargo/config.toml), so
# the crates build once.
TARGET_DIR = ROOT / "build" / "cargo"

pytestmark = pytest.mark.skipif(shutil.which("cargo") is None, reason="needs cargo")


@pytest.fixture(scope="module")
def example() -> Path:
    # No crate registry is reachable or needed: the dependencies are paths.
    env = os.environ | {"PYTHON": sys.executable, "CARGO_TARGET_DIR": str(TARGET_DIR)}
    result = subprocess.run(
        ["cargo", "build", "--offline", "--quiet", "--manifest-path", str(EXAMPLE / "Cargo.toml")],
        env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    # Warnings as errors would change RUSTFLAGS, and so rebuild the crates
    # the workspace's tests built; the output tells the same.
    assert "warning" not in result.stderr, result.stderr
    return TARGET_DIR / "debug" / "allreduce"


def test_runs_alone_as_a_world_of_one(example):
    # No LD_LIBRARY_PATH: the example's build script gave it an rpath.
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    result = subprocess.run([str(example), "1000"], capture_output=True, text=True, timeout=120,
                            env=env)
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
