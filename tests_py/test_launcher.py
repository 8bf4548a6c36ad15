"""concord-run (python -m concord.run), concord.launch and python -m concord."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import concord
from concord.notebook import LaunchError
from helpers import concord_main

# conftest.py clears inherited rendezvous variables, so every launch here
# starts its own job.

# Generous bound for "stopped quickly": ranks that were not stopped sleep 60 s.
_QUICK_S = 20.0


def _script(tmp_path: Path, body: str, name: str = "job.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def _run(*args: str, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "concord.run", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def _rank_lines(output: str, rank: int) -> list[str]:
    prefix = f"[{rank}] "
    return [line[len(prefix):] for line in output.splitlines() if line.startswith(prefix)]


# ---- concord-run ----------------------------------------------------------

def test_ranks_get_their_environment_and_prefixed_output(tmp_path):
    script = _script(tmp_path, """
        import json, os, sys
        names = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "CONCORD_MASTER_ADDR", "CONCORD_MASTER_PORT",
                 "CONCORD_JOB_TOKEN", "CONCORD_STORE_SERVER"]
        print(json.dumps({name: os.environ.get(name) for name in names}))
        print("to stderr", os.environ["RANK"], file=sys.stderr)
    """)
    result = _run("-n", "3", str(script))
    assert result.returncode == 0, result.stderr
    envs = [json.loads(_rank_lines(result.stdout, rank)[0]) for rank in range(3)]
    for rank, env in enumerate(envs):
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "3"
        assert env["MASTER_ADDR"] == env["CONCORD_MASTER_ADDR"] == "127.0.0.1"
        assert env["CONCORD_STORE_SERVER"] == "launcher"
        assert _rank_lines(result.stderr, rank) == [f"to stderr {rank}"]
    assert len({env["MASTER_PORT"] for env in envs}) == 1 and int(envs[0]["MASTER_PORT"]) > 0
    # concord's store has a port of its own: MASTER_PORT is torch's.
    assert len({env["CONCORD_MASTER_PORT"] for env in envs}) == 1
    assert int(envs[0]["CONCORD_MASTER_PORT"]) > 0
    assert envs[0]["CONCORD_MASTER_PORT"] != envs[0]["MASTER_PORT"]
    assert len({env["CONCORD_JOB_TOKEN"] for env in envs}) == 1
    assert len(envs[0]["CONCORD_JOB_TOKEN"]) >= 32
    assert "to stderr" not in result.stdout


def test_script_arguments_pass_through(tmp_path):
    script = _script(tmp_path, "import sys; print(sys.argv[1:])\n")
    result = _run("-n", "1", str(script), "--lr", "0.1", "-n", "7")
    assert result.returncode == 0, result.stderr
    assert _rank_lines(result.stdout, 0) == ["['--lr', '0.1', '-n', '7']"]


def test_module_mode(tmp_path):
    package = tmp_path / "jobpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    _script(package, "import os, sys; print(os.environ['RANK'], sys.argv[1:])\n", "main.py")
    result = _run("-n", "2", "-m", "jobpkg.main", "--flag", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for rank in range(2):
        assert _rank_lines(result.stdout, rank) == [f"{rank} ['--flag']"]


def test_token_from_environment_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv("CONCORD_JOB_TOKEN", "shared-secret")
    script = _script(tmp_path, "import os; print(os.environ['CONCORD_JOB_TOKEN'])\n")
    result = _run("-n", "2", str(script))
    assert result.returncode == 0, result.stderr
    assert _rank_lines(result.stdout, 1) == ["shared-secret"]


def test_cpu_bind_cores_gives_each_local_rank_a_cpu_of_its_own(tmp_path):
    script = _script(tmp_path, "import os; print(sorted(os.sched_getaffinity(0)))\n")
    cpus = sorted(os.sched_getaffinity(0))
    nprocs = len(cpus) + 1  # one more than the CPUs: the last wraps around
    bound = _run("-n", str(nprocs), "--cpu-bind", "cores", str(script))
    assert bound.returncode == 0, bound.stderr
    for rank in range(nprocs):
        assert _rank_lines(bound.stdout, rank) == [str([cpus[rank % len(cpus)]])]
    free = _run("-n", "2", str(script))
    assert free.returncode == 0, free.stderr
    assert _rank_lines(free.stdout, 1) == [str(cpus)]


def test_failing_rank_stops_the_others_and_is_reported(tmp_path):
    script = _script(tmp_path, """
        import os, sys, time
        rank = int(os.environ["RANK"])
        if rank == 2:
            for i in range(100):
                print("progress", i)
            print("giving up")
            sys.exit(4)
        time.sleep(1.0 if rank == 0 else 60)
        sys.exit(5)  # rank 0 would fail too, later, were it not stopped first
    """)
    start = time.monotonic()
    result = _run("-n", "3", str(script))
    assert time.monotonic() - start < _QUICK_S
    assert result.returncode == 4
    assert "rank 2 failed first (exit code 4)" in result.stderr
    assert "stopped the other ranks: 0, 1" in result.stderr
    report = result.stderr[result.stderr.index("failed first"):]
    assert "giving up" in report and "progress 99" in report
    assert "progress 0\n" not in report  # only the last lines are kept


def test_exception_traceback_in_report(tmp_path):
    script = _script(tmp_path, """
        import os
        if os.environ["RANK"] == "1":
            raise ValueError("bad batch")
    """)
    result = _run("-n", "2", str(script))
    assert result.returncode == 1
    assert "rank 1 failed first (exit code 1)" in result.stderr
    assert "ValueError: bad batch" in result.stderr[result.stderr.index("failed first"):]


def test_rank_killed_by_signal_is_reported(tmp_path):
    script = _script(tmp_path, """
        import os, signal, time
        if os.environ["RANK"] == "0":
            print("about to die", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
    """)
    start = time.monotonic()
    result = _run("-n", "2", str(script))
    assert time.monotonic() - start < _QUICK_S
    assert result.returncode == 1
    assert "rank 0 failed first (signal SIGKILL)" in result.stderr
    assert "about to die" in result.stderr[result.stderr.index("failed first"):]


def test_ctrl_c_is_forwarded_to_the_ranks(tmp_path):
    script = _script(tmp_path, """
        import sys, time
        try:
            print("ready", flush=True)
            time.sleep(60)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(130)
    """)
    launcher = subprocess.Popen([sys.executable, "-m", "concord.run", "-n", "2", str(script)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = [launcher.stdout.readline() for _ in range(2)]
        assert sorted(ready) == ["[0] ready\n", "[1] ready\n"]
        launcher.send_signal(signal.SIGINT)
        stdout, stderr = launcher.communicate(timeout=_QUICK_S)
    finally:
        launcher.kill()
    assert launcher.returncode == 130
    assert "interrupted" in stdout
    # The launcher's own signal, not a rank's failure, ended the job.
    assert ("concord-run received SIGINT; stopped the ranks (rank 0: exit code 130, "
            "rank 1: exit code 130)") in stderr
    assert "failed first" not in stderr


def test_bad_command_lines_are_refused(tmp_path):
    script = _script(tmp_path, "pass\n")
    assert _run("-n", "0", str(script)).returncode == 2
    assert _run("-n", "2").returncode == 2
    multi_node = _run("--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", "29999",
                      "-n", "1", str(script))
    assert multi_node.returncode == 2 and "CONCORD_JOB_TOKEN" in multi_node.stderr


def test_collective_through_the_launcher(tmp_path):
    script = _script(tmp_path, """
        import numpy as np
        import concord
        concord.init()
        rank, size = concord.rank(), concord.world_size()
        x = np.arange(10, dtype=np.float32) * (rank + 1)
        got = concord.all_reduce(x)
        expected = np.arange(10, dtype=np.float32) * (size * (size + 1) // 2)
        assert np.array_equal(got, expected), (got, expected)
        print("sum ok", rank, size)
        concord.shutdown()
    """)
    result = _run("-n", "3", str(script))
    assert result.returncode == 0, result.stderr
    for rank in range(3):
        assert _rank_lines(result.stdout, rank) == [f"sum ok {rank} 3"]


def _alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pids, timeout: float) -> list[int]:
    """The pids still alive after `timeout` seconds (each killed then)."""
    deadline = time.monotonic() + timeout
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = [pid for pid in pids if _alive(pid)]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    return alive


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "concord.run", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


_SLEEPER = """
    import os, signal, sys, time
    if os.environ["RANK"] in sys.argv[1:]:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("pid", os.getpid(), flush=True)
    time.sleep(60)
"""


def _pids(launcher: subprocess.Popen, nranks: int) -> list[int]:
    lines = [launcher.stdout.readline() for _ in range(nranks)]
    return [int(line.split()[-1]) for line in lines]


def test_a_signal_to_the_launcher_is_reported_as_its_own(tmp_path):
    launcher = _start("-n", "3", str(_script(tmp_path, _SLEEPER)))
    try:
        pids = _pids(launcher, 3)
        launcher.send_signal(signal.SIGTERM)
        stdout, stderr = launcher.communicate(timeout=_QUICK_S)
    finally:
        launcher.kill()
    assert launcher.returncode == 128 + signal.SIGTERM  # as torchrun exits
    assert stderr == ("concord-run received SIGTERM; stopped the ranks (rank 0: signal SIGTERM, "
                      "rank 1: signal SIGTERM, rank 2: signal SIGTERM)\n")
    assert _wait_gone(pids, 0) == []


def test_a_rank_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path):
    from concord._launching import STOP_GRACE_S

    script = _script(tmp_path, """
        import os, signal, sys, time
        if os.environ["RANK"] == "0":
            time.sleep(0.5)
            sys.exit(3)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(60)
    """)
    start = time.monotonic()
    result = _run("-n", "2", str(script))
    elapsed = time.monotonic() - start
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr
    assert "rank 0 failed first (exit code 3)" in result.stderr
    assert "stopped the other ranks: 1" in result.stderr
    assert STOP_GRACE_S <= elapsed < STOP_GRACE_S + _QUICK_S


def test_a_rank_ignoring_the_launchers_sigterm_is_killed_too(tmp_path):
    from concord._launching import STOP_GRACE_S

    launcher = _start("-n", "2", str(_script(tmp_path, _SLEEPER)), "1")
    try:
        pids = _pids(launcher, 2)
        launcher.send_signal(signal.SIGTERM)
        stdout, stderr = launcher.communicate(timeout=STOP_GRACE_S + _QUICK_S)
    finally:
        launcher.kill()
    assert launcher.returncode == 128 + signal.SIGTERM
    assert "rank 0: signal SIGTERM, rank 1: signal SIGKILL" in stderr
    assert _wait_gone(pids, 0) == []


def test_the_ranks_die_with_a_killed_launcher(tmp_path):
    launcher = _start("-n", "3", str(_script(tmp_path, _SLEEPER)))
    try:
        pids = _pids(launcher, 3)
        launcher.kill()
        launcher.communicate(timeout=_QUICK_S)
    finally:
        launcher.kill()
    assert _wait_gone(pids, 5.0) == []


def test_what_a_rank_left_behind_dies_with_the_job(tmp_path):
    # The rank's child leads a session of its own, out of reach of the
    # signals to the rank's process group.
    script = _script(tmp_path, """
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                 start_new_session=True, stdout=subprocess.DEVNULL)
        print("left", child.pid, flush=True)
    """)
    start = time.monotonic()
    result = _run("-n", "2", str(script))
    assert result.returncode == 0, result.stderr
    pids = [int(line.split()[-1]) for line in result.stdout.splitlines() if "left" in line]
    assert len(pids) == 2
    assert _wait_gone(pids, 0) == []
    assert time.monotonic() - start < _QUICK_S


def test_progress_bars_take_the_rank_prefix_once(tmp_path):
    script = _script(tmp_path, r"""
        import sys
        for step in range(3):
            print(f"\rstep {step}", end="", flush=True)
        print()
    """)
    result = subprocess.run([sys.executable, "-m", "concord.run", "-n", "1", str(script)],
                            capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"\r[0] step 0\r[0] step 1\r[0] step 2\n"


def test_torch_distributed_and_concord_in_one_job(tmp_path):
    pytest.importorskip("torch")
    script = _script(tmp_path, """
        import numpy as np
        import torch
        import torch.distributed as dist
        import concord
        dist.init_process_group("gloo")   # env://: MASTER_ADDR and MASTER_PORT
        concord.init()
        t = torch.full((3,), float(dist.get_rank() + 1))
        dist.all_reduce(t)
        c = concord.all_reduce(np.full(3, concord.rank() + 1.0))
        print(t.tolist(), c.tolist(), flush=True)
        concord.shutdown()
        dist.destroy_process_group()
    """)
    result = _run("-n", "2", str(script), timeout=120)
    assert result.returncode == 0, result.stderr
    for rank in range(2):
        assert _rank_lines(result.stdout, rank) == ["[3.0, 3.0, 3.0] [3.0, 3.0, 3.0]"]


def test_several_nodes_take_the_store_port_beside_torchs(monkeypatch):
    from concord.run import _parse_args

    monkeypatch.setenv("CONCORD_JOB_TOKEN", "shared")
    common = ["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1"]
    args = _parse_args([*common, "--master-port", "29500", "train.py"])
    assert (args.master_port, args.store_port) == (29500, 29501)
    args = _parse_args([*common, "--master-port", "29500", "--store-port", "4000", "train.py"])
    assert (args.master_port, args.store_port) == (29500, 4000)
    for bad in (["--master-port", "29500", "--store-port", "29500"],
                ["--master-port", "65535"], ["--master-port", "29500", "--store-port", "0"]):
        with pytest.raises(SystemExit):
            _parse_args([*common, *bad, "train.py"])


# ---- concord.launch -------------------------------------------------------

def _scaled_rank(factor):
    return int(os.environ["RANK"]) * factor, os.environ["WORLD_SIZE"]


def test_launch_returns_results_in_rank_order():
    assert concord.launch(_scaled_rank, 3, 10) == [(0, "3"), (10, "3"), (20, "3")]


def _all_reduce_rank(n):
    concord.init()
    try:
        return concord.all_reduce(np.full(n, concord.rank() + 1, dtype=np.float64))
    finally:
        concord.shutdown()


def test_launch_runs_collectives():
    results = concord.launch(_all_reduce_rank, 2, 1001)
    for result in results:
        np.testing.assert_array_equal(result, np.full(1001, 3.0))


def test_launch_from_a_process_that_has_a_world():
    # A notebook may have initialised concord (a world of one) before
    # launching; each rank still starts its own world.
    concord.init()
    try:
        results = concord.launch(_all_reduce_rank, 2, 3)
    finally:
        concord.shutdown()
    for result in results:
        np.testing.assert_array_equal(result, np.full(3, 3.0))


def _fail_on_rank_one():
    if os.environ["RANK"] == "1":
        raise ValueError("bad shard")
    time.sleep(60)


def test_launch_raises_naming_the_failed_rank():
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        concord.launch(_fail_on_rank_one, 3)
    assert time.monotonic() - start < _QUICK_S
    error = info.value
    assert isinstance(error, RuntimeError)
    assert (error.rank, error.exc_type, error.exitcode) == (1, "ValueError", None)
    message = str(error)
    assert "rank 1 failed first (raised ValueError: bad shard)" in message
    assert "stopped the other ranks: 0, 2" in message
    assert "_fail_on_rank_one" in message  # the traceback
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is LaunchError and str(copy) == message and copy.rank == 1


def test_launch_error_is_reachable_through_concord_launch():
    assert concord.launch.LaunchError is LaunchError


def _die_on_rank_zero(how):
    if os.environ["RANK"] == "0":
        if how == "exit":
            os._exit(7)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)


@pytest.mark.parametrize("how, cause, exitcode", [
    ("exit", "exit code 7", 7),
    ("kill", "signal SIGKILL", -signal.SIGKILL),
])
def test_launch_reports_a_rank_that_died(how, cause, exitcode):
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        concord.launch(_die_on_rank_zero, 2, how)
    assert time.monotonic() - start < _QUICK_S
    assert (info.value.rank, info.value.exitcode) == (0, exitcode)
    assert f"rank 0 failed first ({cause})" in str(info.value)


def _unpicklable_result():
    return lambda: None


def test_launch_reports_a_result_that_cannot_be_sent():
    with pytest.raises(LaunchError, match="cannot send the result back"):
        concord.launch(_unpicklable_result, 1)


def test_launch_validates_its_arguments():
    with pytest.raises(ValueError):
        concord.launch(_scaled_rank, 0, 1)
    with pytest.raises(TypeError):
        concord.launch("not callable", 1)


# ---- python -m concord ----------------------------------------------------

def test_main_prints_install_locations():
    package = Path(concord.__file__).resolve().parent
    includedir = Path(concord_main("--includedir"))
    libdir = Path(concord_main("--libdir"))
    pkgconfigdir = Path(concord_main("--pkgconfigdir"))
    assert includedir == package / "include"
    assert (includedir / "concord" / "concord.h").is_file()
    assert (includedir / "concord" / "dlpack.h").is_file()
    assert libdir == package / "lib" and list(libdir.glob("libconcord.so*"))
    assert (pkgconfigdir / "concord.pc").is_file()
    assert concord_main("--version") == concord.__version__


def test_main_needs_one_flag():
    result = subprocess.run([sys.executable, "-m", "concord"], capture_output=True, timeout=60)
    assert result.returncode == 2


def test_launch_checks_the_start_method():
    with pytest.raises(ValueError, match="start_method must be one of 'fork', 'spawn', "
                                         "'forkserver', got 'thread'"):
        concord.launch(_scaled_rank, 1, 1, start_method="thread")


_KERNEL = """
    import os, sys, time
    import concord

    def work(out_dir):
        with open(os.path.join(out_dir, f"rank{os.environ['RANK']}"), "w") as f:
            f.write(str(os.getpid()))
        time.sleep(60)

    if __name__ == "__main__":
        concord.launch(work, 2, sys.argv[1], start_method=sys.argv[2])
"""


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_launched_ranks_die_with_a_killed_kernel(tmp_path, start_method):
    kernel = subprocess.Popen([sys.executable, str(_script(tmp_path, _KERNEL)), str(tmp_path),
                               start_method])
    files = [tmp_path / f"rank{rank}" for rank in range(2)]
    try:
        deadline = time.monotonic() + 60
        while not all(f.exists() and f.read_text() for f in files):
            assert time.monotonic() < deadline and kernel.poll() is None
            time.sleep(0.05)
        pids = [int(f.read_text()) for f in files]
        kernel.kill()
        kernel.wait(timeout=_QUICK_S)
    finally:
        kernel.kill()
    assert _wait_gone(pids, 5.0) == []


_TORCH_KERNEL = """
    import sys, warnings
    import torch
    import concord

    def work(n):
        # Parallel torch ops in the rank: a forked rank would hang here.
        x = torch.randn(n, n)
        concord.init()
        total = concord.all_reduce((x @ x).sum().reshape(1).numpy() * 0 + 1)
        concord.shutdown()
        return float(total[0])

    def nothing():
        return None

    if __name__ == "__main__":
        torch.randn(1000, 1000) @ torch.randn(1000, 1000)  # torch's thread pool starts
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            concord.launch(nothing, 1)
        print([w.category.__name__ for w in caught])
        print(concord.launch(work, 2, 600, start_method=sys.argv[1]))
"""


def test_launch_after_torch_used_its_threads(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.get_num_threads() < 2:
        pytest.skip("torch runs one intra-op thread here: forking would be safe")
    result = subprocess.run([sys.executable, str(_script(tmp_path, _TORCH_KERNEL)), "spawn"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    warned, results = result.stdout.splitlines()
    assert warned == "['UnsafeForkWarning']"  # forking this process is what warns
    assert results == "[2.0, 2.0]"
