"""Ranks on several hosts: test hosts are network namespaces with their own
host name and /dev/shm (netns.py), the ranks of each started by a
concord-run of its own (--nnodes, --node-rank, --master-addr), by mpirun or
torchrun across the hosts, or directly (with srun's variables, or where a
launcher would get in the way).

Each job runs many checks in one launch (starting ranks is the cost on a
small machine); every rank returns the checks that failed.
"""

import functools
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import concord as cc
import netns
from collective_checks import Checks
from helpers import finish_sessions, report

_WORKER = Path(__file__).with_name("gpu_helpers.py")
# Ports of the job on node0: every test host has its own port space.
_MASTER_PORT = 29500
_STORE_PORT = _MASTER_PORT + 1
_JOB_TIMEOUT_S = 150
LARGE = 1000003
DTYPES = ["bfloat16", "float16", "float32", "float64", "int8", "int32", "int64", "uint8", "bool"]
LARGE_DTYPES = ["bfloat16", "float32", "int64"]


@functools.cache
def _namespaces_problem():
    return netns.unavailable()


@pytest.fixture
def test_hosts():
    """make(count) -> TestHosts, entered; every one is closed after the test,
    which then checks that no namespace is left and that the machine's
    /dev/shm got nothing (each host had its own)."""
    problem = _namespaces_problem()
    if problem is not None:
        print(f"skipping: {problem}")
        pytest.skip(problem)
    before = set(os.listdir("/dev/shm"))
    made = []

    def make(count):
        hosts = netns.TestHosts(count).__enter__()
        made.append(hosts)
        return hosts

    try:
        yield make
    finally:
        for hosts in made:
            hosts.close()
    listed = netns.namespaces()
    left = [name for hosts in made for name in [hosts.switch, *hosts.namespaces] if name in listed]
    assert left == [], f"namespaces left behind: {left}"
    new = sorted(name for name in set(os.listdir("/dev/shm")) - before if "concord" in name)
    assert new == [], f"the machine's /dev/shm got {new}"


def _job_env(token):
    env = dict(os.environ, CONCORD_JOB_TOKEN=token, PYTHONUNBUFFERED="1")
    env.pop("CONCORD_TIMEOUT", None)
    return env


def _worker_args(fn, args, out_dir):
    return [str(_WORKER), __file__, fn.__name__, json.dumps(args), str(out_dir)]


def _launcher(hosts, node, nprocs, *target, extra=()):
    return [sys.executable, "-m", "concord.run", "--nnodes", str(hosts.count),
            "--node-rank", str(node), "-n", str(nprocs), "--master-addr", hosts.address(0),
            "--master-port", str(_MASTER_PORT), *extra, *target]


def _outputs(results):
    return "\n".join(f"--- process {i}: status {code} ---\n{out[-4000:]}\n{err[-6000:]}"
                     for i, (code, out, err) in enumerate(results))


def _run_on_every_host(hosts, argv, env, timeout=_JOB_TIMEOUT_S):
    """argv(node) on every host, to its end; each must succeed."""
    processes = [hosts.popen(node, argv(node), env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, errors="replace")
                 for node in range(hosts.count)]
    results = finish_sessions(processes, timeout)
    assert all(code == 0 for code, _, _ in results), _outputs(results)


def _run_job(hosts, nprocs, fn, *args, tmp_path, timeout=_JOB_TIMEOUT_S):
    """fn(*args) on `nprocs` ranks of each host, one concord-run per host;
    the results in rank order."""
    out_dir = tmp_path / f"{fn.__name__}-{secrets.token_hex(3)}"
    out_dir.mkdir()
    _run_on_every_host(
        hosts, lambda node: _launcher(hosts, node, nprocs, *_worker_args(fn, args, out_dir)),
        _job_env(secrets.token_hex(16)), timeout)
    return [json.loads((out_dir / f"rank{rank}.json").read_text())
            for rank in range(hosts.count * nprocs)]


# ---- the ranks' side -----------------------------------------------------------

def _facts(comm):
    return {"backend": comm.backend, "host": socket.gethostname(), "rank": comm.rank,
            "size": comm.size, "local_rank": comm.local_rank}


def _suite(checks, dtypes, large_dtypes, roots):
    for dtype in dtypes:
        for size in (0, 1, 7):
            checks.all_reduce(dtype, (size,))
            checks.all_gather(dtype, (size,))
            checks.reduce_scatter(dtype, size)
            checks.broadcast(dtype, (size,), roots)
        checks.all_reduce(dtype, (3, 5))
        checks.all_gather_axes(dtype)
        checks.reduce_scatter_axes(dtype)
    for dtype in large_dtypes:
        checks.all_reduce(dtype, (LARGE,), variants=False)
        checks.all_gather(dtype, (LARGE,), variants=False)
        checks.reduce_scatter(dtype, LARGE // checks.size, variants=False)
        checks.broadcast(dtype, (LARGE,), roots[-1:])
    checks.all_reduce_multi(dtypes, (0, 1, 7, 1003))
    checks.all_reduce_multi(["float32", "int64"], (LARGE,), async_op=True)


def _every_collective(seed, backend, split_colors):
    """The suite on the world (every root), then on the sub-communicators of
    split_colors[rank] (ordered by descending world rank), which cross hosts."""
    world = cc.init(backend, timeout=120.0)
    checks = Checks(seed)
    _suite(checks, DTYPES, LARGE_DTYPES, list(range(world.size)))
    cc.barrier()
    sub = world.split(split_colors[world.rank], key=-world.rank)
    sub_checks = Checks(seed + 1, sub)
    _suite(sub_checks, ["bfloat16", "float32", "int32", "bool"], ["float32"],
           list(range(sub.size)))
    facts = {"world": _facts(world), "sub": _facts(sub)}
    sub.close()
    cc.shutdown()
    return {"facts": facts, "failures": checks.failures + sub_checks.failures}


def _a_few_collectives(seed):
    """The world's facts and a few checked collectives."""
    world = cc.init(timeout=60.0)
    checks = Checks(seed)
    checks.all_reduce("float32", (LARGE,), variants=False)
    checks.all_gather("int32", (7,))
    checks.broadcast("bfloat16", (1000,), [world.size - 1])
    facts = _facts(world)
    cc.shutdown()
    return {"facts": facts, "failures": checks.failures}


def _block_then_die(victim, timeout, out_dir):
    """Every rank but `victim` enters a large all_reduce the victim never
    joins, and says when; the victim says its pid and waits to be killed."""
    comm = cc.init(timeout=timeout)
    x = np.ones(1 << 22, np.float32)
    cc.barrier()
    ready = Path(out_dir) / f"ready{comm.rank}"
    if comm.rank == victim:
        ready.write_text(str(os.getpid()))
        time.sleep(3 * timeout)
        return {}
    ready.write_text("")
    try:
        cc.all_reduce(x)
        outcome = {"error": None}
    except cc.ConcordError as exc:
        outcome = {"error": type(exc).__name__, "message": str(exc), "at": time.time()}
    cc.shutdown()
    return outcome


def _fail_on_one_node(failing, code):
    """Every rank joins the world; rank `failing` then exits with `code`,
    the others sleep (only their launchers can end them early)."""
    cc.init(timeout=60.0)
    cc.barrier()
    if cc.rank() == failing:
        sys.exit(code)
    time.sleep(120)
    return {}


# ---- the tests -------------------------------------------------------------------

def _check_results(results, seed, layout, backend, sub_backends):
    failures = [f for result in results for f in result["failures"]]
    assert not failures, report(failures, seed)
    for rank, result in enumerate(results):
        world, sub = result["facts"]["world"], result["facts"]["sub"]
        node, local = divmod(rank, layout[1])
        assert (world["backend"], world["host"], world["rank"], world["local_rank"]) == \
               (backend, f"node{node}", rank, local)
        assert sub["backend"] == sub_backends[rank], (rank, sub)


def test_two_hosts_of_two_ranks_use_shm_and_gloo(test_hosts, tmp_path, seed):
    hosts = test_hosts(2)
    # {0, 2} and {1, 3}: one rank on each host; ordered 2, 0 and 3, 1.
    results = _run_job(hosts, 2, _every_collective, seed, "auto", [0, 1, 0, 1],
                       tmp_path=tmp_path)
    _check_results(results, seed, (2, 2), "shm+gloo", ["gloo"] * 4)
    assert [r["facts"]["sub"]["rank"] for r in results] == [1, 1, 0, 0]


def test_three_hosts_of_one_rank_use_gloo(test_hosts, tmp_path, seed):
    hosts = test_hosts(3)
    # {0, 2} across hosts; rank 1 alone, on one host: shm.
    results = _run_job(hosts, 1, _every_collective, seed, "auto", [0, 1, 0], tmp_path=tmp_path)
    _check_results(results, seed, (3, 1), "gloo", ["gloo", "shm", "gloo"])


def test_gloo_forced_on_one_host(test_hosts, tmp_path, seed):
    hosts = test_hosts(1)
    # {0, 1} and {2}: a sub-communicator of one rank too.
    results = _run_job(hosts, 3, _every_collective, seed, "gloo", [0, 0, 1], tmp_path=tmp_path)
    _check_results(results, seed, (1, 3), "gloo", ["gloo"] * 3)


def _check_two_hosts_of_two_ranks(out_dir, seed):
    """The results of _a_few_collectives on node0's ranks 0, 1 and node1's 2, 3."""
    results = [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in range(4)]
    failures = [f for result in results for f in result["failures"]]
    assert not failures, report(failures, seed)
    assert [(r["facts"]["backend"], r["facts"]["host"], r["facts"]["local_rank"])
            for r in results] == [("shm+gloo", f"node{rank // 2}", rank % 2) for rank in range(4)]


def test_ranks_started_by_mpirun_across_hosts(test_hosts, tmp_path, seed):
    if shutil.which("mpirun") is None:
        pytest.skip("needs mpirun (Open MPI)")
    hosts = test_hosts(2)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{name} slots=2\n" for name in hosts.names))
    # mpirun starts its daemon on node1 through the remote shell, in place of ssh.
    env = dict(_job_env(secrets.token_hex(16)), OMPI_MCA_oob_tcp_if_include=netns.INTERFACE,
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    mpirun = hosts.run(0, ["mpirun", "--hostfile", hostfile, "-np", "4", "--mca",
                           "plm_rsh_agent", hosts.remote_shell(), "-x", "CONCORD_JOB_TOKEN",
                           "-x", f"CONCORD_MASTER_ADDR={hosts.address(0)}",
                           "-x", f"CONCORD_MASTER_PORT={_STORE_PORT}", sys.executable,
                           *_worker_args(_a_few_collectives, [seed], tmp_path)],
                       timeout=_JOB_TIMEOUT_S, env=env)
    assert mpirun.returncode == 0, mpirun.stdout[-3000:] + mpirun.stderr[-5000:]
    _check_two_hosts_of_two_ranks(tmp_path, seed)


def test_ranks_started_by_torchrun_across_hosts(test_hosts, tmp_path, seed):
    pytest.importorskip("torch.distributed.run")
    hosts = test_hosts(2)
    # As torchrun leaves it: no secret of concord's, so rank 0 serves
    # concord's store and publishes it through torch's on node0.
    env = _job_env("")
    del env["CONCORD_JOB_TOKEN"]
    _run_on_every_host(
        hosts, lambda node: [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                             "--node-rank", str(node), "--nproc-per-node", "2",
                             "--master-addr", hosts.address(0), "--master-port", str(_MASTER_PORT),
                             *_worker_args(_a_few_collectives, [seed], tmp_path)], env)
    _check_two_hosts_of_two_ranks(tmp_path, seed)


# What srun's step daemon does on a node: starts the node's tasks, each with
# its rank variables, in one mount namespace (so one /dev/shm), and fails
# when one fails. argv: tasks per node, node index, then the task's command.
_SLURM_NODE = """
import os, subprocess, sys
per_node, node, command = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
tasks = [subprocess.Popen(command, env=dict(os.environ, SLURM_PROCID=str(node * per_node + local),
                                            SLURM_LOCALID=str(local), SLURM_NODEID=str(node)))
         for local in range(per_node)]
sys.exit(max(task.wait() for task in tasks))
"""


def test_ranks_started_as_srun_starts_them_across_hosts(test_hosts, tmp_path, seed):
    # No Slurm here: each host starts its tasks with the variables srun
    # gives them (--nodes 2 --ntasks-per-node 2) and the three of concord's
    # that the guide says to export.
    hosts = test_hosts(2)
    env = dict(_job_env(secrets.token_hex(16)), CONCORD_MASTER_ADDR=hosts.address(0),
               CONCORD_MASTER_PORT=str(_STORE_PORT), SLURM_NTASKS="4", SLURM_NNODES="2",
               SLURM_STEP_NUM_NODES="2", SLURM_JOB_NUM_NODES="2")
    _run_on_every_host(
        hosts, lambda node: [sys.executable, "-c", _SLURM_NODE, "2", str(node), sys.executable,
                             *_worker_args(_a_few_collectives, [seed], tmp_path)], env)
    _check_two_hosts_of_two_ranks(tmp_path, seed)


def test_a_rank_killed_on_one_host_fails_the_ranks_of_both(test_hosts, tmp_path):
    hosts = test_hosts(2)
    timeout, victim, nprocs = 20.0, 3, 2
    out_dir = tmp_path / "killed"
    out_dir.mkdir()
    token = secrets.token_hex(16)
    ranks = []
    # No launcher: it would stop the survivors as soon as the victim dies.
    for rank in range(2 * nprocs):
        node, local = divmod(rank, nprocs)
        env = dict(_job_env(token), RANK=str(rank), LOCAL_RANK=str(local),
                   WORLD_SIZE=str(2 * nprocs), LOCAL_WORLD_SIZE=str(nprocs),
                   MASTER_ADDR=hosts.address(0), MASTER_PORT=str(_STORE_PORT))
        ranks.append(hosts.popen(node, [sys.executable,
                                        *_worker_args(_block_then_die, [victim, timeout,
                                                                       str(out_dir)], out_dir)],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, errors="replace"))
    deadline = time.monotonic() + 60
    while len(list(out_dir.glob("ready*"))) < 2 * nprocs:
        assert time.monotonic() < deadline and all(p.poll() is None for p in ranks), \
            _outputs(finish_sessions(ranks, 1))
        time.sleep(0.05)
    time.sleep(0.5)  # the survivors are waiting in the all_reduce
    killed_at = time.time()
    os.kill(int((out_dir / f"ready{victim}").read_text()), signal.SIGKILL)
    results = finish_sessions(ranks, timeout + 30)
    for rank, (code, _, _) in enumerate(results):
        if rank != victim:
            assert code == 0, _outputs(results)
    for rank in range(2 * nprocs):
        if rank == victim:
            continue
        outcome = json.loads((out_dir / f"rank{rank}.json").read_text())
        assert outcome["error"] == "RemoteError", (rank, outcome)
        assert f"rank {victim}" in outcome["message"], (rank, outcome)
        assert outcome["at"] - killed_at < timeout + 2, (rank, outcome["at"] - killed_at)


def test_a_rank_failing_on_one_node_stops_every_node(test_hosts, tmp_path):
    hosts = test_hosts(2)
    env = _job_env(secrets.token_hex(16))
    started = time.monotonic()
    launchers = [hosts.popen(node, _launcher(hosts, node, 2,
                                             *_worker_args(_fail_on_one_node, [2, 3], tmp_path)),
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             errors="replace")
                 for node in range(2)]
    results = finish_sessions(launchers, 90)
    assert time.monotonic() - started < 60, _outputs(results)
    (code0, _, err0), (code1, _, err1) = results
    assert code1 == 3, _outputs(results)
    assert "concord-run: node 1 rank 2 failed first (exit code 3)\n" \
           "concord-run: stopped the other ranks: 3\n" in err1, err1
    assert code0 == 1, _outputs(results)
    assert "concord-run: node 1 rank 2 failed first (exit code 3)\n" \
           "concord-run: stopped the ranks of node 0: 0, 1\n" in err0, err0


def test_the_launcher_refuses_several_nodes_without_a_token(test_hosts, tmp_path):
    hosts = test_hosts(2)
    env = _job_env("")
    del env["CONCORD_JOB_TOKEN"]
    for node in range(2):
        result = hosts.run(node, _launcher(hosts, node, 1, sys.executable, "-c", "pass"),
                           timeout=60, env=env)
        assert result.returncode == 2, result
        assert "--nnodes > 1 needs the same CONCORD_JOB_TOKEN exported on every node" \
            in result.stderr


_SERVE = """
import sys, time
from concord import _capi
server = _capi.StoreServer(sys.argv[1], int(sys.argv[2]), sys.argv[3])
print("serving", flush=True)
time.sleep(60)
"""

# Connects to the store with each token given: what each got, as JSON.
_CONNECT = """
import json, socket, sys
from concord import _capi
host, port, timeout, *tokens = sys.argv[1:]
outcomes = {}
for token in tokens:
    try:
        with _capi.Store(host, int(port), token, float(timeout)) as store:
            store.set(socket.gethostname(), b"hello")
            outcomes[token] = ["ok", bytes(store.get(socket.gethostname())).decode()]
    except Exception as exc:
        outcomes[token] = [type(exc).__name__, str(exc)]
print(json.dumps(outcomes))
"""


def test_the_store_refuses_a_wrong_token_from_another_host(test_hosts):
    hosts = test_hosts(2)
    token, wrong = secrets.token_hex(16), secrets.token_hex(16)
    server = hosts.popen(0, [sys.executable, "-c", _SERVE, hosts.address(0), str(_STORE_PORT),
                             token], stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "serving"
    connected = hosts.run(1, [sys.executable, "-c", _CONNECT, "node0", _STORE_PORT, 10, wrong,
                              token], timeout=60)
    assert connected.returncode == 0, connected
    outcomes = json.loads(connected.stdout)
    assert outcomes[wrong] == ["InvalidArgumentError",
                               "store refused the connection: wrong job token"]
    assert outcomes[token] == ["ok", "hello"]
    # Bound to node0's address only: not reachable on node0's loopback.
    local = hosts.run(0, [sys.executable, "-c", _CONNECT, "127.0.0.1", _STORE_PORT, 1, token],
                      timeout=60)
    assert json.loads(local.stdout)[token][0] != "ok", local
