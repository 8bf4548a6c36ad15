"""cc.build_info(): what this build includes and what this machine offers.

"cuda" and "nccl" each say whether the build includes them ("built") and
whether they can be used here ("available"); "nccl" also names the NCCL
version found (None when there is none). These checks run everywhere; the
ones that need a device to tell are marked gpu.
"""

import importlib.util
import os

import pytest

import concord as cc


def _torch_sees_a_device():
    """True or False when torch can tell whether this machine has a CUDA
    device; None when it cannot (no torch, or a torch built without CUDA)."""
    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    if torch.version.cuda is None:
        return None
    return torch.cuda.is_available()


def test_build_info_describes_cuda_and_nccl():
    info = cc.build_info()
    for key in ("cuda", "nccl"):
        part = info[key]
        assert isinstance(part, dict), f"build_info()[{key!r}] is {part!r}"
        for flag in ("built", "available"):
            assert isinstance(part.get(flag), bool), f"build_info()[{key!r}][{flag!r}]: {part}"
        if not part["built"]:
            assert not part["available"], f"{key} is available but not built: {part}"
    version = info["nccl"]["version"]
    assert version is None or (isinstance(version, str) and version), info["nccl"]
    if info["nccl"]["available"]:
        assert version is not None, f"NCCL is available, without a version: {info['nccl']}"


def test_build_info_is_fresh_json_each_call():
    first = cc.build_info()
    first["cuda"]["available"] = "changed"
    assert cc.build_info()["cuda"]["available"] != "changed"


def test_cuda_is_unavailable_without_a_device():
    device = _torch_sees_a_device()
    if device is None:  # without a CUDA-enabled torch, the device nodes tell
        device = os.path.exists("/dev/nvidia0")
    if device:
        pytest.skip("this machine has a CUDA device")
    info = cc.build_info()
    assert info["cuda"]["available"] is False, info["cuda"]


@pytest.mark.gpu
def test_cuda_is_available_where_built_and_a_device_is_present():
    info = cc.build_info()
    if not info["cuda"]["built"]:
        pytest.skip("this build does not include CUDA")
    assert info["cuda"]["available"] is True, info["cuda"]
