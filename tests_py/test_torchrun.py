"""concord under the real torchrun (python -m torch.distributed.run): one
host with no variables of concord's, and two "hosts" (two torchrun agents
meeting through a c10d rendezvous, each saying its ranks are not all the
job's), where rank 0 publishes concord's store through torch's."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap

import pytest

from helpers import finish_sessions

pytest.importorskip("torch.distributed.run")

_TIMEOUT_S = 180

_JOB = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    import concord as cc

    comm = cc.init(timeout=60.0)
    total = cc.all_reduce(np.full(3, cc.rank() + 1.0)).tolist()
    gathered = cc.all_gather(np.array([cc.rank()])).tolist()
    facts = {"rank": cc.rank(), "size": cc.world_size(), "total": total, "gathered": gathered,
             "token": os.environ.get("CONCORD_JOB_TOKEN")}
    with open(os.path.join(sys.argv[1], f"rank{cc.rank()}.json"), "w") as out:
        json.dump(facts, out)
    cc.shutdown()
""")


def _torchrun(*args):
    # Each agent leads a process group of its own, with its ranks, so that
    # a test that fails leaves none of them behind.
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *args],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _finish(agents):
    """Each agent's output (stderr included)."""
    return [stdout for _, stdout, _ in finish_sessions(agents, _TIMEOUT_S)]


def _check(tmp_path, size):
    for rank in range(size):
        facts = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert facts == {"rank": rank, "size": size, "total": [size * (size + 1) / 2] * 3,
                         "gathered": list(range(size)), "token": None}


def test_torchrun_on_one_host(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(_JOB)
    agent = _torchrun("--standalone", "--nproc-per-node", "3", str(script), str(tmp_path))
    [output] = _finish([agent])
    assert agent.returncode == 0, output
    _check(tmp_path, 3)


def test_torchrun_on_two_hosts(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(_JOB)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    agents = [_torchrun("--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                        "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", tmp_path.name,
                        str(script), str(tmp_path))
              for _ in range(2)]
    outputs = _finish(agents)
    for agent, output in zip(agents, outputs):
        assert agent.returncode == 0, output
    _check(tmp_path, 2)
