"""An all_reduce of JAX arrays: concord.jax inside jax.jit vs eager concord
vs a jax.pure_callback detour.

    python3 bench/jax_jit.py                      # 2 ranks, 8 B .. 64 MiB
    python3 bench/jax_jit.py --quick
    python3 bench/jax_jit.py --nprocs 2,4 --sizes 8,4K

For each float32 message size, the median time of one all_reduce (sum) of
the slowest rank, five ways:

- in jit: concord.jax's all_reduce inside jitted lax.fori_loops of K and
  2K calls, timed in alternation: the difference of their times over K is
  what a collective costs inside compiled code, and 2 x T(K) - T(2K) what
  each jitted call costs besides (its dispatch, its carry copied in, its
  result's fresh memory), shown as a note;
- jit per call: a jitted function of one concord.jax all_reduce, called
  and waited for from Python (JAX's dispatch included);
- pure_callback: the detour that worked before concord.jax, a
  jax.pure_callback running concord's eager all_reduce on the host, inside
  the same jitted fori_loops of K and 2K calls, timed the same way;
- eager JAX: concord's eager all_reduce of a concrete JAX array (through a
  NumPy view, the result back into JAX);
- eager NumPy: concord's eager all_reduce of a NumPy array into a
  preallocated one, the floor of the eager path.

Ratios are each way's time over "in jit"'s. The target: in jit, 8 bytes
on 2 ranks, under 20 us per call. Each measurement ends with one call on
rank-dependent data checked against NumPy. JAX runs on the CPU.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

import _timing
from _timing import Budget

DEFAULT_SIZES = (8, 4 << 10, 256 << 10, 4 << 20, 64 << 20)
TARGET_BYTES = 8
TARGET_US = 20.0
COLLECTIVE_TIMEOUT_S = 300
FULL = Budget(seconds=2.0, min_iters=5, max_iters=2000, max_warmup=50)
QUICK = Budget(seconds=0.5, min_iters=3, max_iters=500, max_warmup=10)
METHODS = ("in jit", "jit per call", "pure_callback", "eager JAX", "eager NumPy")
LOOPED = ("in jit", "pure_callback")  # timed as loops of K and 2K calls in one jitted call


def calls_per_loop(nbytes: int) -> int:
    """K: enough calls that a loop takes milliseconds, and at least a few."""
    return max(4, min(1000, (2 << 20) // max(nbytes, 2048)))


# ---------------------------------------------------------------- worker


def jax_worker(plan: dict) -> dict:
    import jax

    jax.config.update("jax_platforms", "cpu")
    import jax.numpy as jnp

    import concord as cc
    import concord.jax as cj

    cc.init(timeout=COLLECTIVE_TIMEOUT_S)
    rank, size = cc.rank(), cc.world_size()
    budget = Budget(**plan["budget"])

    def max_over_ranks(values):
        return cc.all_reduce(values, op="max", out=values)

    def host_all_reduce(v):
        return cc.all_reduce(np.asarray(v))

    def looped(collective, calls):
        return jax.jit(lambda v: jax.lax.fori_loop(0, calls, lambda i, c: collective(c), v))

    def looped_ways(calls):
        """{method: a call on its JAX input} of the LOOPED ways, running
        `calls` collectives."""
        in_jit = looped(cj.all_reduce, calls)
        callback = looped(lambda c: jax.pure_callback(
            host_all_reduce, jax.ShapeDtypeStruct(c.shape, c.dtype), c), calls)
        return {"in jit": lambda v: in_jit(v).block_until_ready(),
                "pure_callback": lambda v: callback(v).block_until_ready()}

    def ways(n, calls):
        """{method: a call on its input (a JAX array, or NumPy for eager
        NumPy)}, the looped ones running `calls` collectives."""
        out = np.empty(n, np.float32)
        in_loops = looped_ways(calls)
        per_call = jax.jit(cj.all_reduce)
        return {
            "in jit": in_loops["in jit"],
            "jit per call": lambda v: per_call(v).block_until_ready(),
            "pure_callback": in_loops["pure_callback"],
            "eager JAX": lambda v: jnp.asarray(cc.all_reduce(np.asarray(v))).block_until_ready(),
            "eager NumPy": lambda v: cc.all_reduce(v, out=out),
        }

    def correct(method, n):
        """One call (a loop of one, for the looped ways) on rank-dependent
        data, against NumPy."""
        mine = np.arange(n, dtype=np.float32) % 7 + rank
        expected = np.arange(n, dtype=np.float32) % 7 * size + size * (size - 1) / 2
        result = ways(n, 1)[method](mine if method == "eager NumPy" else jnp.asarray(mine))
        return bool(np.allclose(np.asarray(result), expected, rtol=1e-6))

    results = []
    for nbytes in plan["sizes"]:
        n = max(1, nbytes // 4)
        calls = calls_per_loop(nbytes)
        # Zeros stay zeros under a sum: the loops need nothing but the
        # collective to stay finite.
        inputs = {"eager NumPy": np.zeros(n, np.float32)}
        doubled = looped_ways(2 * calls)
        for method, fn in ways(n, calls).items():
            x = inputs.get(method, jnp.zeros(n, jnp.float32))
            measured = {"bytes": nbytes, "method": method, "calls": 1,
                        "correct": correct(method, n)}
            if method in LOOPED:
                once, twice = _timing.interleaved([lambda: fn(x), lambda: doubled[method](x)],
                                                  budget, cc.barrier, max_over_ranks)
                measured.update(calls=calls, per_call_s=max(twice - once, 0.0) / calls,
                                fixed_s=max(2 * once - twice, 0.0))
            else:
                times = _timing.measure(lambda: fn(x), budget, cc.barrier, max_over_ranks)
                measured["per_call_s"] = float(np.median(times))
            results.append(measured)
    cc.shutdown()
    return {"rank": rank, "measurements": results}


def run_worker(plan_path: str, out_path: str) -> int:
    result = jax_worker(_timing.read_json(plan_path))
    if result["rank"] == 0:
        _timing.write_json(out_path, result)
    return 0


# ----------------------------------------------------------------- parent


def run_job(n: int, sizes: list[int], budget: Budget, workdir: str) -> tuple[dict, str | None]:
    plan_path = os.path.join(workdir, f"plan-{n}.json")
    out_path = os.path.join(workdir, f"result-{n}.json")
    _timing.write_json(plan_path, {"budget": budget.__dict__, "sizes": sizes})
    command = [sys.executable, "-m", "concord.run", "-n", str(n), os.path.abspath(__file__),
               "--worker", plan_path, out_path]
    print(f"bench: {n} ranks ...", file=sys.stderr, flush=True)
    outcome = _timing.run_job(command, dict(os.environ), 1800)
    results = _timing.read_json(out_path) or {}
    failure = outcome.failure() or (None if results else "wrote no results")
    print(f"bench: {n} ranks: {outcome.seconds:.0f} s" + (f", FAILED: {failure}" if failure else ""),
          file=sys.stderr, flush=True)
    return results, failure


def rows_for(results: dict, sizes: list[int]) -> list[list[str]]:
    by = {(m["bytes"], m["method"]): m for m in results.get("measurements", [])}
    rows = []
    for nbytes in sizes:
        reference = by.get((nbytes, METHODS[0]))
        for method in METHODS:
            m = by.get((nbytes, method))
            if m is None:
                continue
            ratio = ("-" if reference is None or reference["per_call_s"] <= 0
                     else f"{m['per_call_s'] / reference['per_call_s']:.2f}")
            notes = [] if m["correct"] else ["WRONG RESULT"]
            if "fixed_s" in m:
                notes.append(f"+{m['fixed_s'] * 1e6:.0f} us a jitted call")
            rows.append([_timing.format_bytes(nbytes), method, str(m["calls"]),
                         f"{m['per_call_s'] * 1e6:.1f}", ratio, "; ".join(notes)])
    return rows


def verdict(results: dict) -> str:
    for m in results.get("measurements", []):
        if m["bytes"] == TARGET_BYTES and m["method"] == METHODS[0]:
            us = m["per_call_s"] * 1e6
            return (f"  {METHODS[0]}, {TARGET_BYTES} B: {us:.1f} us per call (target < "
                    f"{TARGET_US:.0f} us) {'PASS' if us < TARGET_US else 'FAIL'}")
    return "  not measured"


def run_parent(args) -> int:
    budget = QUICK if args.quick else FULL
    print(f"all_reduce (sum) of float32 JAX arrays on the CPU; {os.cpu_count()} cores; "
          f"load average {os.getloadavg()[0]:.2f}")
    failed = False
    with tempfile.TemporaryDirectory(prefix="concord-bench-") as workdir:
        for n in args.nprocs:
            results, failure = run_job(n, args.sizes, budget, workdir)
            print(f"\n{n} ranks: median time of one all_reduce, slowest rank "
                  f"(calls: K, per jitted loop of K and 2K)")
            print(_timing.format_table(["size", "method", "calls", "us", "x in jit", "note"],
                                       rows_for(results, args.sizes)))
            if failure:
                failed = True
                print(f"  note: {failure}")
            if n == 2 and TARGET_BYTES in args.sizes:
                print("target, 2 ranks:")
                print(verdict(results))
    print(f"\nLoad average at the end {os.getloadavg()[0]:.2f}.")
    return 1 if failed else 0


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nprocs", default="2", type=lambda s: [int(v) for v in s.split(",")],
                        help="world sizes, comma-separated (default 2)")
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)),
                        type=lambda s: [_timing.parse_bytes(v) for v in s.split(",")],
                        help="message sizes in bytes, K/M/G suffixes (default 8 B .. 64 MiB)")
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    # A rank of the job: where its plan is, and where rank 0 writes the results.
    parser.add_argument("--worker", nargs=2, metavar=("PLAN", "OUT"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    return run_worker(*args.worker) if args.worker else run_parent(args)


if __name__ == "__main__":
    sys.exit(main())
