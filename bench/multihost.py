"""CPU collectives across hosts: concord against torch.distributed (gloo)
and Open MPI (tcp between hosts), on test hosts made of network namespaces
(tests_py/netns.py), all in the same run. Needs root.

    python3 bench/multihost.py                       # 8 B .. 16 MiB
    python3 bench/multihost.py --max-bytes 256M      # the full range
    python3 bench/multihost.py --no-shaping --libs concord,gloo --layouts 2x2

Each host's link is shaped (by default 10 Gbit/s and 50 us with netem,
or the rate alone with a token bucket where the kernel has no netem; the
shaping used is printed). Layouts are HOSTSxRANKS: 2x2 (shm+gloo for
concord) and 4x1 (gloo). For every (operation, layout) it prints the median
time of the slowest rank, algbw and busbw (nccl-tests formulas), each
peer's time over concord's, and the bytes the busiest host sent per call
(its interface's tx_bytes counter over a few untimed calls).

concord and torch gloo ranks are started by a concord-run on each host;
Open MPI's by mpirun on node0, which starts its daemons on the other
hosts through an agent that enters their namespaces (in place of ssh).
The workers are bench/allreduce_cpu.py's, which check every result.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import _timing
import allreduce_cpu as cpu
from _timing import Budget

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests_py"))
import netns  # noqa: E402  (the test hosts live with the tests)

OPS = ("all_reduce", "all_gather", "reduce_scatter")
LAYOUTS = ("2x2", "4x1")
# Ports on node0 (each test host has its own port space).
MASTER_PORT = 29500
TORCH_PORT = 29600
DEFAULT_RATE = "10gbit"
DEFAULT_DELAY = "50us"
# Untimed calls whose traffic gives the bytes sent per call.
COUNTED_CALLS = 3
BUDGET = Budget(seconds=1.0, min_iters=5, max_iters=500)
JOB_TIMEOUT_S = 1200.0


# ---------------------------------------------------------------- workers


def tx_bytes() -> int:
    """What this host has sent so far (the worker runs inside its namespace)."""
    return int(Path(f"/sys/class/net/{netns.INTERFACE}/statistics/tx_bytes").read_text())


def sent_per_call(coll, op: str, nbytes: int, host: int, nhosts: int) -> list[float]:
    """Bytes each host sent per call of op, every rank's view merged."""
    x, y = cpu.buffers(op, cpu.element_count(op, nbytes, coll.size), coll.size)
    run = coll.bind(op, x, y)
    run()
    coll.barrier()
    before = tx_bytes()
    for _ in range(COUNTED_CALLS):
        run()
    coll.barrier()
    sent = np.zeros(nhosts)
    sent[host] = (tx_bytes() - before) / COUNTED_CALLS
    return coll.max_over_ranks(sent).tolist()


def run_worker(lib: str, plan_path: str, out_path: str) -> int:
    plan = _timing.read_json(plan_path)
    coll = cpu.COLLECTIVES[lib](plan)
    host = coll.rank // plan["per_host"]
    results = {"measurements": [], "errors": {}, "done": False}
    for op in plan["ops"]:
        for nbytes in plan["sizes"]:
            try:
                measured = cpu.measure_op(coll, op, nbytes, BUDGET)
                measured["sent"] = sent_per_call(coll, op, nbytes, host, plan["hosts"])
                results["measurements"].append(measured)
            except Exception as exc:  # the op is unsupported or broken: report it, go on
                results["errors"][op] = (f"at {_timing.format_bytes(nbytes)}: "
                                         f"{type(exc).__name__}: {exc}")
                break
            finally:
                if coll.rank == 0:
                    _timing.write_json(out_path, results)
    results["done"] = True
    if coll.rank == 0:
        _timing.write_json(out_path, results)
    coll.close()
    return 0


# ----------------------------------------------------------------- parent


def shape_links(hosts: netns.TestHosts, rate: str, delay: str) -> str:
    """Shapes every host's egress; says how."""
    shaped = [hosts.shape(k, ["netem", "delay", delay, "rate", rate]) for k in range(hosts.count)]
    if all(result.returncode == 0 for result in shaped):
        return f"netem: {rate} and {delay} on each host's egress"
    why = shaped[0].stderr.strip()
    for k in range(hosts.count):
        token_bucket = hosts.shape(k, ["tbf", "rate", rate, "burst", "1mb", "latency", "10ms"])
        if token_bucket.returncode != 0:
            return f"none (netem: {why}; tbf: {token_bucket.stderr.strip()})"
    return f"tbf: {rate} on each host's egress, no added delay (netem: {why})"


def job_env(token: str) -> dict[str, str]:
    return dict(os.environ, CONCORD_JOB_TOKEN=token, GLOO_SOCKET_IFNAME=netns.INTERFACE,
                # Open MPI: tcp between hosts, shared memory within one, on
                # the test hosts' interface; ranks outnumber the cores.
                OMPI_MCA_btl="tcp,vader,self", OMPI_MCA_pml="ob1",
                OMPI_MCA_btl_tcp_if_include=netns.INTERFACE,
                OMPI_MCA_oob_tcp_if_include=netns.INTERFACE, OMPI_MCA_mpi_yield_when_idle="1",
                OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def launch(hosts: netns.TestHosts, lib: str, per_host: int, worker: list[str], env: dict,
           workdir: str) -> list[subprocess.Popen]:
    def start(k: int, argv: list[str]) -> subprocess.Popen:
        return hosts.popen(k, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, errors="replace")

    if lib == "mpi":
        hostfile = os.path.join(workdir, "hostfile")
        Path(hostfile).write_text("".join(f"{name} slots={per_host}\n" for name in hosts.names))
        return [start(0, ["mpirun", "--hostfile", hostfile, "-np", str(hosts.count * per_host),
                          "--mca", "plm_rsh_agent", hosts.remote_shell(), *worker])]
    return [start(k, [sys.executable, "-m", "concord.run", "--nnodes", str(hosts.count),
                      "--node-rank", str(k), "-n", str(per_host), "--master-addr",
                      hosts.address(0), "--master-port", str(MASTER_PORT), "--timeout",
                      str(cpu.COLLECTIVE_TIMEOUT_S), *worker])
            for k in range(hosts.count)]


def run_lib(hosts: netns.TestHosts, lib: str, per_host: int, plan: dict,
            workdir: str) -> cpu.LibRun:
    tag = f"{lib}-{hosts.count}x{per_host}"
    plan_path = os.path.join(workdir, f"plan-{tag}.json")
    out_path = os.path.join(workdir, f"result-{tag}.json")
    _timing.write_json(plan_path, dict(plan, torch_port=TORCH_PORT))
    worker = [sys.executable, os.path.abspath(__file__), "--worker", lib, "--plan", plan_path,
              "--out", out_path]
    print(f"bench: {cpu.LABELS[lib]} on {hosts.count}x{per_host} ...", file=sys.stderr, flush=True)
    processes = launch(hosts, lib, per_host, worker, job_env(secrets.token_hex(16)), workdir)
    failure = None
    for process in processes:
        try:
            output, _ = process.communicate(timeout=JOB_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            failure = f"timed out after {JOB_TIMEOUT_S:.0f} s"
            break
        if process.returncode != 0 and failure is None:
            tail = " | ".join(line.strip() for line in output.strip().splitlines()[-6:])
            failure = f"exited with status {process.returncode}; last output: {tail}"
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.communicate()
    results = _timing.read_json(out_path) or {}
    if failure is None and not results.get("done"):
        failure = "exited without writing all its results"
    if failure:
        print(f"bench: {cpu.LABELS[lib]} on {hosts.count}x{per_host}: FAILED: {failure}",
              file=sys.stderr, flush=True)
    return cpu.LibRun(results, failure)


def fmt_bytes(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if value >= scale:
            return f"{value / scale:.1f}{unit}"
    return f"{value:.0f}"


def busiest_host_sent(run: cpu.LibRun, op: str, nbytes: int) -> float | None:
    for m in run.results.get("measurements", []):
        if m["op"] == op and m["nbytes"] == nbytes:
            return max(m["sent"])
    return None


def print_table(op: str, layout: str, n: int, libs: list[str], runs: dict) -> None:
    factor = _timing.bus_factor(op, n)
    print(f"\n{op}  float32  {layout} ({n} ranks; busbw = algbw * {factor:.2f};"
          f" sent = bytes the busiest host sent per call)")
    headers = ["size"]
    for lib in libs:
        short = cpu.SHORT[lib]
        headers += [f"{short} us", f"{short} algbw", f"{short} busbw"]
        headers += [f"{short}/cc"] if lib != "concord" else []
        headers.append(f"{short} sent")
    sizes = sorted({m["nbytes"] for lib in libs
                    for m in runs[(lib, layout)].results.get("measurements", []) if m["op"] == op})
    rows = []
    for nbytes in sizes:
        ours = runs[("concord", layout)].median_s(op, nbytes) if "concord" in libs else None
        row = [_timing.format_bytes(nbytes)]
        for lib in libs:
            run = runs[(lib, layout)]
            t = run.median_s(op, nbytes)
            row += [cpu.fmt_us(t), cpu.fmt_gbs(None if t is None else _timing.algbw(nbytes, t)),
                    cpu.fmt_gbs(None if t is None else _timing.busbw(op, nbytes, t, n))]
            row += [cpu.fmt_ratio(t, ours)] if lib != "concord" else []
            row.append(fmt_bytes(busiest_host_sent(run, op, nbytes)))
        rows.append(row)
    print(_timing.format_table(headers, rows))
    for lib in libs:
        run = runs[(lib, layout)]
        if run.failure:
            print(f"  note: {cpu.LABELS[lib]}: {run.failure}")
        if op in run.results.get("errors", {}):
            print(f"  note: {cpu.LABELS[lib]}: {op} failed {run.results['errors'][op]}")
        wrong = [_timing.format_bytes(m["nbytes"]) for m in run.results.get("measurements", [])
                 if m["op"] == op and not m["correct"]]
        if wrong:
            print(f"  note: {cpu.LABELS[lib]}: WRONG RESULT at {', '.join(wrong)}")


def run_parent(args) -> int:
    problem = netns.unavailable()
    if problem is not None:
        print(f"bench: cannot make test hosts: {problem}", file=sys.stderr)
        return 1
    missing = {lib: why for lib in args.libs if (why := cpu.unavailable(lib))}
    libs = [lib for lib in args.libs if lib not in missing]
    sizes = cpu.default_sizes(args.min_bytes, args.max_bytes, 8)
    print(f"CPU collectives across test hosts (network namespaces on {os.uname().nodename},"
          f" {os.cpu_count()} cores: every host shares them)")
    for lib in libs:
        print(f"  {cpu.LABELS[lib]}: {cpu.lib_version(lib)}")
    for lib, why in missing.items():
        print(f"  {cpu.LABELS[lib]}: not measured, {why}")
    cpu.print_load("start")
    runs = {}
    for layout in args.layouts:
        nhosts, per_host = map(int, layout.split("x"))
        plan = {"ops": args.ops, "sizes": sizes, "hosts": nhosts, "per_host": per_host}
        with netns.TestHosts(nhosts) as hosts, tempfile.TemporaryDirectory() as workdir:
            shaping = "none (--no-shaping)" if args.no_shaping \
                else shape_links(hosts, args.rate, args.delay)
            print(f"{layout}: link shaping: {shaping}", flush=True)
            for lib in libs:
                runs[(lib, layout)] = run_lib(hosts, lib, per_host, plan, workdir)
    for op in args.ops:
        for layout in args.layouts:
            nhosts, per_host = map(int, layout.split("x"))
            print_table(op, layout, nhosts * per_host, libs, runs)
    cpu.print_load("end")
    return 0 if all(run.failure is None for run in runs.values()) else 1


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--min-bytes", type=_timing.parse_bytes, default=8,
                        help="smallest size (default 8)")
    parser.add_argument("--max-bytes", type=_timing.parse_bytes, default=16 << 20,
                        help="largest size (default 16M; 256M for the full range); sizes step by 8")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), type=lambda s: s.split(","),
                        help=f"HOSTSxRANKS, comma-separated (default {','.join(LAYOUTS)})")
    parser.add_argument("--ops", default=",".join(OPS), type=lambda s: s.split(","),
                        help=f"operations, comma-separated (default {','.join(OPS)})")
    parser.add_argument("--libs", default=",".join(cpu.LIBS), type=lambda s: s.split(","),
                        help=f"libraries, comma-separated (default {','.join(cpu.LIBS)})")
    parser.add_argument("--rate", default=DEFAULT_RATE, help=f"link rate (default {DEFAULT_RATE})")
    parser.add_argument("--delay", default=DEFAULT_DELAY,
                        help=f"added one-way delay, with netem (default {DEFAULT_DELAY})")
    parser.add_argument("--no-shaping", action="store_true", help="leave the links unshaped")
    parser.add_argument("--worker", choices=cpu.LIBS, help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name, chosen, allowed in (("--ops", args.ops, OPS), ("--libs", args.libs, cpu.LIBS)):
        if unknown := set(chosen) - set(allowed):
            parser.error(f"{name}: unknown {', '.join(sorted(unknown))}; "
                         f"choose from {', '.join(allowed)}")
    for layout in args.layouts:
        hosts, _, ranks = layout.partition("x")
        if not (hosts.isdigit() and ranks.isdigit() and int(hosts) >= 1 and int(ranks) >= 1):
            parser.error(f"--layouts: {layout!r} is not HOSTSxRANKS")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return run_worker(args.worker, args.plan, args.out)
    return run_parent(args)  # Ctrl-C: the test hosts go, with what runs on them


if __name__ == "__main__":
    sys.exit(main())
