"""Loading the CUDA plugin and NCCL, on any machine: what build_info()
reports and the reasons it gives when something is missing. (The GPU work
itself is tested by test_gpu_*.py where a device exists.)"""

import json
import os
import subprocess
import sys

import pytest

import concord as cc


def build_info_with(**env):
    """build_info() of a fresh process with `env` added (the plugin and NCCL
    are looked for once per process)."""
    out = subprocess.run(
        [sys.executable, "-c", "import concord, json; print(json.dumps(concord.build_info()))"],
        env={**os.environ, **env}, capture_output=True, text=True, check=True, timeout=120)
    return json.loads(out.stdout)


def test_built_and_available_are_reported_apart():
    info = cc.build_info()
    for part in ("cuda", "nccl"):
        assert isinstance(info[part]["built"], bool)
        assert isinstance(info[part]["available"], bool)
        # A reason exactly when unavailable.
        assert (info[part]["problem"] is None) == info[part]["available"]
    assert info["backends"]["nccl"] == info["nccl"]["built"]
    if info["nccl"]["available"]:
        major, minor, patch = info["nccl"]["version"].split(".")
        assert int(major) == 2 and int(minor) >= 14
        assert "libnccl" in info["nccl"]["library"]
    if not info["cuda"]["built"]:
        assert "no CUDA support" in info["cuda"]["problem"]


def test_missing_nccl_names_what_was_looked_for():
    if not cc.build_info()["nccl"]["built"]:
        pytest.skip("this build has no CUDA plugin")
    info = build_info_with(CONCORD_NCCL_LIBRARY="/nonexistent/libnccl.so.2")
    assert info["nccl"]["available"] is False
    assert info["nccl"]["version"] is None
    problem = info["nccl"]["problem"]
    assert "/nonexistent/libnccl.so.2" in problem
    assert "CONCORD_NCCL_LIBRARY" in problem


def test_missing_plugin_makes_cuda_unavailable_and_cpu_still_works():
    if not cc.build_info()["cuda"]["built"]:
        pytest.skip("this build has no CUDA plugin")
    info = build_info_with(CONCORD_CUDA_PLUGIN="/nonexistent/libconcord_cuda.so")
    for part in ("cuda", "nccl"):
        assert info[part]["built"] is True
        assert info[part]["available"] is False
        assert "/nonexistent/libconcord_cuda.so" in info[part]["problem"]
    code = ("import numpy as np, concord as cc; cc.init(); "
            "print(cc.all_reduce(np.arange(3.0)).tolist())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "CONCORD_CUDA_PLUGIN": "/nonexistent/x.so"}, check=True)
    assert out.stdout.strip() == "[0.0, 1.0, 2.0]"


def test_without_a_device_cuda_is_unavailable_with_a_reason():
    info = cc.build_info()
    if info["cuda"]["available"]:
        pytest.skip("this machine has a CUDA device")
    assert info["cuda"]["devices"] == 0
    assert info["cuda"]["problem"]
