"""concord.metrics functional reductions against NumPy references.

Multi-rank checks run in one concord.launch job per world size; every rank
builds every rank's pytree from (rank, seed), so it computes the reference
itself and returns the checks that failed.
"""

import numpy as np
import optree
import pytest

import concord as cc
from concord import metrics

SEED = 20240607

try:  # torch inputs are checked when torch is installed
    import torch
except ImportError:
    torch = None


def rank_tree(rank):
    """A nested pytree of every supported leaf kind, with rank-dependent values."""
    rng = np.random.default_rng([SEED, rank])
    return {
        "loss": float(rng.uniform(-1, 1)),
        "steps": int(rng.integers(0, 100)),
        "scale": np.float32(rng.uniform(0, 1)),
        "vec": rng.uniform(-2, 2, 7).astype(np.float32),
        "ints": rng.integers(-50, 50, 5).astype(np.int32),
        "nested": {
            "grid": rng.uniform(-1, 1, (3, 2)),
            "empty": np.zeros(0, np.float64),
            "flags": (bool(rng.integers(0, 2)), rng.integers(0, 2, 4).astype(bool)),
        },
        "skip": None,
    }


def reference(trees, op):
    """op over the ranks' leaves by concord's rules: integer arrays mean
    truncates, Python ints/bools average as floats, bools sum as ints."""
    def combine(*leaves):
        stack = np.stack([np.asarray(leaf) for leaf in leaves])
        first = leaves[0]
        if op in ("max", "min"):
            result = getattr(stack, op)(axis=0)
        elif op == "sum":
            dtype = np.int64 if stack.dtype == bool else stack.dtype
            result = stack.sum(axis=0, dtype=dtype)
        elif stack.dtype.kind in "iu" and not isinstance(first, int):
            result = np.trunc(stack.astype(np.float64).mean(axis=0)).astype(stack.dtype)
        else:
            floats = stack.astype(np.float64 if stack.dtype.kind in "biu" else stack.dtype)
            result = floats.mean(axis=0)
        return result.item() if isinstance(first, (bool, int, float)) else result

    return {k: _map(combine, [t[k] for t in trees]) for k in trees[0]}


def _map(fn, values):
    return optree.tree_map(fn, *values)


def same(actual, expected, rtol=1e-6):
    """Equal values and the same leaf types, as a list of problems."""
    problems = []
    a_leaves, a_def = optree.tree_flatten(actual)
    e_leaves, e_def = optree.tree_flatten(expected)
    if a_def != e_def:
        return [f"structure {a_def} != {e_def}"]
    for a, e in zip(a_leaves, e_leaves):
        if type(a) is not type(e):
            problems.append(f"type {type(a).__name__} != {type(e).__name__}")
        elif getattr(a, "dtype", None) != getattr(e, "dtype", None):
            problems.append(f"dtype {a.dtype} != {e.dtype}")
        elif not np.allclose(np.asarray(a, np.float64), np.asarray(e, np.float64), rtol=rtol):
            problems.append(f"value {a!r} != {e!r}")
    return problems


class CountingHandle:
    """Stands in for a communicator's C handle and counts its collectives."""

    def __init__(self, handle):
        self._real = handle
        self.calls = []

    def __getattr__(self, name):
        attr = getattr(self._real, name)
        if name in ("all_reduce", "all_reduce_multi", "all_gather"):
            def counted(*args, **kwargs):
                self.calls.append(name)
                return attr(*args, **kwargs)
            return counted
        return attr


def functional_checks():
    comm = cc.init()
    rank, size = comm.rank, comm.size
    trees = [rank_tree(r) for r in range(size)]
    mine = rank_tree(rank)
    failures = []

    for op, fn in (("mean", metrics.reduce_mean), ("sum", metrics.reduce_sum),
                   ("max", metrics.reduce_max), ("min", metrics.reduce_min)):
        result = fn(mine)
        failures += [f"reduce_{op}: {p}" for p in same(result, reference(trees, op))]
    failures += [f"reduce_mean_collective: {p}" for p in
                 same(metrics.reduce_mean_collective(mine), reference(trees, "mean"))]
    failures += [f"reduce_sum_collective: {p}" for p in
                 same(metrics.reduce_sum_collective(mine, axis_name="batch"), reference(trees, "sum"))]

    # One fused collective per reduce op, none per key, after the ranks
    # agreed on the pytree (one small all-gather, none in a world of one);
    # inputs never written.
    counting = CountingHandle(comm._handle)
    comm._handle = counting
    before = {k: np.copy(v) for k, v in mine.items() if isinstance(v, np.ndarray)}
    custom = metrics.reduce_custom(mine, {"steps": "sum", "vec": "MAX", "ints": "min",
                                          "nested": None, "absent": "sum"})
    comm._handle = counting._real
    if counting.calls != ["all_gather"] * (size > 1) + ["all_reduce_multi"] * 4:
        failures.append(f"reduce_custom issued {counting.calls}")
    if any(not np.array_equal(before[k], mine[k]) for k in before):
        failures.append("reduce_custom wrote its input")
    expected = {
        "loss": reference(trees, "mean")["loss"],  # missing key: mean
        "steps": reference(trees, "sum")["steps"],
        "scale": reference(trees, "mean")["scale"],
        "vec": reference(trees, "max")["vec"],
        "ints": reference(trees, "min")["ints"],
        "nested": mine["nested"],
        "skip": None,
    }
    failures += [f"reduce_custom: {p}" for p in same(custom, expected)]
    if any(a is not b for a, b in zip(optree.tree_leaves(custom["nested"]),
                                      optree.tree_leaves(mine["nested"]))):
        failures.append("reduce_custom: None did not pass the value through unchanged")

    # torch tensors come back as torch tensors.
    if torch is not None:
        tensor = torch.arange(4, dtype=torch.float32) * (rank + 1)
        summed = metrics.reduce_sum({"t": tensor})["t"]
        if not isinstance(summed, torch.Tensor) or not torch.equal(
                summed, torch.arange(4, dtype=torch.float32) * sum(range(1, size + 1))):
            failures.append(f"reduce_sum on torch: {summed!r}")

    gathered = metrics.all_gather(mine)
    stacked = _map(lambda *leaves: np.stack([np.asarray(x) for x in leaves]), trees)
    failures += [f"all_gather: {p}" for p in same(
        optree.tree_map(np.asarray, gathered), optree.tree_map(np.asarray, stacked))]
    if not isinstance(gathered["loss"], np.ndarray) or gathered["loss"].shape != (size,):
        failures.append(f"all_gather of a Python scalar: {gathered['loss']!r}")
    if torch is not None:
        torch_gathered = metrics.all_gather({"t": tensor})["t"]
        if not isinstance(torch_gathered, torch.Tensor) or tuple(torch_gathered.shape) != (size, 4):
            failures.append(f"all_gather on torch: {torch_gathered!r}")

    collected = metrics.collect_from_devices(mine)
    expected_lists = _map(lambda *leaves: list(leaves), trees)
    flat_c = optree.tree_leaves(collected, is_leaf=lambda x: isinstance(x, list))
    flat_e = optree.tree_leaves(expected_lists, is_leaf=lambda x: isinstance(x, list))
    for c, e in zip(flat_c, flat_e):
        failures += [f"collect_from_devices: {p}" for p in same(c, e)]

    # Mesh axes: a name of the active mesh works, another is a ValueError.
    with cc.use_mesh(cc.make_mesh((size,), ("data",))):
        failures += [f"reduce_sum over a mesh axis: {p}" for p in
                     same(metrics.reduce_sum(mine, axis_name="data"), reference(trees, "sum"))]
        try:
            metrics.reduce_sum(mine, axis_name="batch")
            failures.append("an axis name outside the mesh did not raise")
        except ValueError:
            pass
    return failures


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_functional_reductions_match_numpy(nprocs):
    results = cc.launch(functional_checks, nprocs)
    assert results == [[]] * nprocs


# ---- datarax's default axis "batch" on a mesh --------------------------------------

def seeded_tree(seed, rank):
    rng = np.random.default_rng([seed, rank])
    return {"loss": rng.uniform(-2, 2, 5), "acc": rng.uniform(0, 1, (3, 2)).astype(np.float32),
            "n": rng.integers(-40, 40, 7)}


def _default_axis_job(seed):
    """datarax's collectives on a 2 x 2 mesh with no "batch" axis, with the
    default and with names passed; on one whose first axis is "batch"; and
    with no mesh."""
    cc.init(timeout=60.0)
    mine = seeded_tree(seed, cc.rank())
    seen = {}
    with cc.use_mesh(cc.make_mesh((2, 2), ("data", "model"))):
        seen["mean, default"] = metrics.reduce_mean_collective(mine)
        seen["sum, default"] = metrics.reduce_sum_collective(mine)
        seen["sum, data"] = metrics.reduce_sum_collective(mine, "data")
        for how, call in [
                ("mean, batch passed", lambda: metrics.reduce_mean_collective(mine, "batch")),
                ("sum, batch passed by keyword",
                 lambda: metrics.reduce_sum_collective(mine, axis_name="batch")),
                ("reduce_sum, batch passed", lambda: metrics.reduce_sum(mine, axis_name="batch"))]:
            try:
                call()
            except ValueError as exc:
                seen[how] = f"{type(exc).__name__}: {exc}"
    with cc.use_mesh(cc.make_mesh((2, 2), ("batch", "model"))):
        seen["sum, default, a batch axis"] = metrics.reduce_sum_collective(mine)
    seen["sum, default, no mesh"] = metrics.reduce_sum_collective(mine)
    # The refused calls reduced nothing: the ranks are still in step.
    seen["after"] = cc.all_reduce(np.ones(1)).tolist()
    return seen


def test_datarax_default_axis_is_the_whole_mesh_on_a_mesh_without_it(seed):
    trees = [seeded_tree(seed, rank) for rank in range(4)]

    def over(ranks, op):
        return reference([trees[r] for r in ranks], op)

    unknown = "InvalidArgumentError: unknown axis 'batch'; mesh axes are ('data', 'model')"
    for rank, seen in enumerate(cc.launch(_default_axis_job, 4, seed)):
        # Rank r sits at (r // 2, r % 2): its first axis holds r % 2 and r % 2 + 2.
        first_axis = [rank % 2, rank % 2 + 2]
        expected = {"mean, default": over(range(4), "mean"),
                    "sum, default": over(range(4), "sum"),
                    "sum, data": over(first_axis, "sum"),
                    "sum, default, a batch axis": over(first_axis, "sum"),
                    "sum, default, no mesh": over(range(4), "sum")}
        for how, tree in expected.items():
            assert same(seen[how], tree, rtol=1e-6) == [], how
        for how in ("mean, batch passed", "sum, batch passed by keyword",
                    "reduce_sum, batch passed"):
            assert seen[how] == unknown, how
        assert seen["after"] == [4.0]


def test_reduce_custom_rejects_unknown_ops_before_communicating():
    # No world is initialised: a collective would raise ConcordError instead.
    with pytest.raises(ValueError, match="unknown reduce op 'median' for 'loss'"):
        metrics.reduce_custom({"loss": 1.0}, {"loss": "median"})
    with pytest.raises(ValueError, match="unknown reduce op 3"):
        metrics.reduce_custom({"loss": 1.0}, {"loss": 3})


def test_reduce_rejects_non_numeric_leaves(world1):
    with pytest.raises(ValueError, match="cannot reduce a leaf of type str"):
        metrics.reduce_mean({"name": "x"})


def test_reductions_on_a_world_of_one_return_the_values(world1):
    tree = {"a": 2.5, "b": np.arange(3, dtype=np.int64), "c": [None, True]}
    assert metrics.reduce_mean(tree)["a"] == 2.5
    assert np.array_equal(metrics.reduce_sum(tree)["b"], tree["b"])
    assert metrics.reduce_max(tree)["c"] == [None, True]
    assert metrics.reduce_mean({}) == {}
    assert metrics.collect_from_devices({"a": 1}) == {"a": [1]}


# ---- ranks that pass different pytrees -------------------------------------------

def _a(shape, dtype=np.float32):
    return np.ones(shape, dtype)


# Each case: (call, rank 0's pytree, the other ranks' pytree); for
# reduce_custom the pytree is (metrics, reduce_fn). Every pair has the same
# number of elements and bytes, so only the agreement can tell them apart.
MISMATCHES = {
    "renamed key": ("reduce_mean", {"a": _a(3), "b": _a(3)}, {"a": _a(3), "c": _a(3)}),
    "swapped shapes": ("reduce_sum", {"a": _a((2, 3)), "b": _a((3, 2))},
                       {"a": _a((3, 2)), "b": _a((2, 3))}),
    "another dtype": ("reduce_max", {"a": _a(4, np.float32)}, {"a": _a(4, np.int32)}),
    "another structure": ("reduce_min", {"a": [_a(2), _a(2)]}, {"a": (_a(2), _a(2))}),
    "swapped ops": ("reduce_custom", ({"a": _a(2), "b": _a(2)}, {"a": "sum", "b": "max"}),
                    ({"a": _a(2), "b": _a(2)}, {"a": "max", "b": "sum"})),
    "an op against none": ("reduce_custom", ({"a": _a(2)}, {"a": "sum"}),
                           ({"a": _a(2)}, {"a": None})),
    "mean against sum": ("reduce_mean", {"a": _a(2)}, "reduce_sum"),
    "gathered shapes": ("all_gather", {"a": _a((2, 3))}, {"a": _a((3, 2))}),
    "collected keys": ("collect_from_devices", {"x": 1.0}, {"y": 1.0}),
}


def _call(name, tree):
    if name == "reduce_custom":
        return metrics.reduce_custom(*tree)
    return getattr(metrics, name)(tree)


def mismatch_checks():
    """Every case of MISMATCHES in turn; each rank returns, per case, the
    error it got, then checks that the world still works."""
    cc.init(timeout=60.0)
    outcomes = {}
    for case, (name, first, others) in MISMATCHES.items():
        if isinstance(others, str):  # the same pytree, another function
            name, tree = (name, first) if cc.rank() == 0 else (others, first)
        else:
            tree = first if cc.rank() == 0 else others
        try:
            _call(name, tree)
            outcomes[case] = None
        except cc.MismatchError as exc:
            outcomes[case] = str(exc)
    # Nothing was reduced: the ranks are still in step.
    total = cc.all_reduce(np.ones(1)).tolist()
    cc.shutdown()
    return outcomes, total


@pytest.mark.parametrize("nprocs", [2, 3])
def test_ranks_passing_different_pytrees_get_mismatch_error(nprocs):
    for rank, (outcomes, total) in enumerate(cc.launch(mismatch_checks, nprocs)):
        assert total == [float(nprocs)]
        for case, message in outcomes.items():
            assert message is not None, f"rank {rank}, {case}: no MismatchError"
            name = MISMATCHES[case][0]
            assert "ranks passed different metric pytrees" in message, message
            assert f"ranks [0]; ranks {list(range(1, nprocs))}" in message, message
            assert f"This rank ({rank}) passed" in message, message
            if name != "reduce_mean" or case != "mean against sum":
                assert message.startswith(name), message
