"""torch.distributed on the "concord" backend (concord.torch), in jobs of
fresh processes started the two ways a torch user starts them: concord-run
and torchrun. The checks run in the ranks (torch_backend_checks.py); each
job makes all of them, since importing torch is most of a job's cost.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import report

pytest.importorskip("torch")

SECTIONS = ["collectives", "ddp", "subgroups", "errors"]
# The rank entry point of conftest's process_ranks: it imports this module
# in each rank, calls a function of it and writes the result as JSON.
RANK_ENTRY = Path(__file__).with_name("gpu_helpers.py")
JOB_TIMEOUT_S = 300.0


def rank_checks(seed, device, sections):
    """Runs in each rank: the checks of `sections` on `device`."""
    import torch_backend_checks

    return torch_backend_checks.run(seed, device, sections)


def ranks_sharing_the_gpu_checks(seed, sections):
    """Runs in each rank of a job whose ranks share GPU 0."""
    import torch
    from test_gpu_collectives import share_the_gpu

    share_the_gpu(int(os.environ["RANK"]))
    torch.cuda.set_device(0)
    return rank_checks(seed, "cuda:0", sections)


def assert_passed(results, seed, sections):
    failures = [failure for result in results for failure in result["failures"]]
    assert not failures, report(failures, seed)
    for rank, result in enumerate(results):
        for section in sections:
            assert result["counts"][section] > 0, f"rank {rank} made no {section} check"


def torchrun_ranks(tmp_path, nprocs, fn, *args):
    """fn(*args) (a function of this module; JSON in and out) in each rank
    of a `torchrun --standalone` job; the results in rank order."""
    out_dir = tmp_path / f"torchrun-{fn.__name__}"
    out_dir.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(nprocs), str(RANK_ENTRY), __file__, fn.__name__,
               json.dumps(args), str(out_dir)]
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, errors="replace",
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        # torchrun passes SIGTERM on to its workers; SIGKILL if it lingers.
        os.killpg(process.pid, signal.SIGTERM)
        try:
            output, _ = process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
        raise AssertionError(f"torchrun was stopped after {JOB_TIMEOUT_S:.0f} s\n"
                             f"{output[-6000:]}") from None
    assert process.returncode == 0, (f"torchrun exited with status {process.returncode}\n"
                                     f"{output[-6000:]}")
    return [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in range(nprocs)]


def leave_collectives_pending(nbytes, count):
    """Runs in each rank: starts `count` asynchronous all_reduces of
    `nbytes` on the concord group and returns (the process then exits)
    without waiting for them or destroying the group."""
    import torch
    import torch.distributed as dist

    import concord.torch

    dist.init_process_group(concord.torch.NAME)
    tensors = [torch.full((nbytes // 4,), float(dist.get_rank() + 1)) for _ in range(count)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    return {"rank": dist.get_rank(), "pending": sum(not w.get_future().done() for w in works)}


def test_ranks_exit_cleanly_with_collectives_pending(process_ranks):
    """The process exits with status 0 on every rank (the job fails
    otherwise), as torch's own backends let a script end without
    destroy_process_group(), though collectives were still running when
    it ended."""
    results = process_ranks(2, leave_collectives_pending, 16 << 20, 8, timeout=JOB_TIMEOUT_S)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["pending"] > 0 for r in results), results


def test_importing_concord_does_not_import_torch():
    code = "import sys, concord; print('torch' in sys.modules)"
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=60, check=True).stdout.strip()
    assert shown == "False"


def test_torch_api_under_concord_run(process_ranks, seed):
    """Three ranks (an odd world): every section, env:// through the
    launcher's store."""
    results = process_ranks(3, rank_checks, seed, "cpu", SECTIONS, timeout=JOB_TIMEOUT_S)
    assert_passed(results, seed, SECTIONS)


def test_torch_api_under_torchrun(tmp_path, seed):
    """Two ranks under torchrun itself, which needs nothing of concord's."""
    results = torchrun_ranks(tmp_path, 2, rank_checks, seed, "cpu", SECTIONS)
    assert_passed(results, seed, SECTIONS)


@pytest.mark.gpu
def test_torch_api_on_cuda(process_ranks, seed):
    """The same on CUDA tensors (NCCL through concord), two ranks on one GPU."""
    sections = ["collectives", "ddp", "subgroups"]
    results = process_ranks(2, ranks_sharing_the_gpu_checks, seed, sections,
                            timeout=JOB_TIMEOUT_S)
    assert_passed(results, seed, sections)
