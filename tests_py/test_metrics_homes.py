"""Metric states live where the inputs live (the metric's home).

torch CPU tensors stand in for every non-NumPy array library: they run the
namespace-generic code (array-API updates, syncs of torch states, host
copies for state_dict) that torch CUDA and CuPy arrays run on a GPU. Every
torch result is checked against the same metric fed NumPy arrays, and
against the NumPy references of test_metrics, on 1-3 ranks.
"""

import warnings
from pathlib import Path

import numpy as np
import optree
import pytest

import concord as cc
from concord import metrics as M
from concord._host import device_key, to_host
from concord.metrics.sync import Entry, StateSpec, _signature
from helpers import load_module


# test_metrics: its data set, metrics and NumPy references.
base = load_module(Path(__file__).with_name("test_metrics.py"), "_concord_metrics_reference")


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def as_torch(torch, data):
    return {key: torch.from_numpy(np.array(value, copy=True)) for key, value in data.items()}


def state_arrays(metric):
    """Every state array of a metric: synced parts and windows."""
    return [*metric._synced.values(), *(metric._window_value(n) for n in metric._specs)]


def same_value(got, expected):
    """Problems with a compute() result (array results: torch tensors)
    against another metric's (NumPy arrays or torch tensors)."""
    if hasattr(expected, "numpy"):
        expected = expected.numpy()
    if isinstance(expected, np.ndarray):
        if type(got).__module__.split(".")[0] != "torch":
            return [f"a {type(got).__name__}, not a torch tensor"]
        got = got.numpy()
        if got.dtype != expected.dtype or got.shape != expected.shape:
            return [f"{got.dtype}{got.shape} != {expected.dtype}{expected.shape}"]
        return [] if np.array_equal(got, expected, equal_nan=True) else [f"{got} != {expected}"]
    if type(got) is not type(expected):
        return [f"a {type(got).__name__}, not a {type(expected).__name__}"]
    return [] if got == expected or (np.isnan(got) and np.isnan(expected)) else [
        f"{got} != {expected}"]


def compare(got, expected):
    return [f"{name}: {problem}" for name in expected
            for problem in same_value(got[name], expected[name])]


def quiet_compute(metrics):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return {name: metric.compute() for name, metric in metrics.items()}


# ---------------------------------------------------------------- one process


def test_torch_inputs_give_torch_states_and_the_numpy_results(torch):
    d = base.dataset()
    numpy_fed, torch_fed = base.make_metrics(), base.make_metrics()
    everything = slice(0, base.N)
    base.update_in_two(numpy_fed, d, everything)
    base.update_in_two(torch_fed, as_torch(torch, d), everything)
    for name, metric in torch_fed.items():
        assert metric._home.xp is not np, name
        assert all(isinstance(a, torch.Tensor) for a in state_arrays(metric)), name
        assert all(isinstance(a, np.ndarray) for a in state_arrays(numpy_fed[name])), name
    got, expected = quiet_compute(torch_fed), quiet_compute(numpy_fed)
    assert compare(got, expected) == []
    assert base.mismatches(got, base.references()) == []
    for name, metric in torch_fed.items():
        state = metric.state_dict()
        for part in ("synced", "window"):
            assert all(type(a) is np.ndarray for a in state[part].values()), name
        assert base.states_equal(state, numpy_fed[name].state_dict()), name


def test_empty_metrics_and_python_values_in_a_torch_home(torch):
    # Before any data, results are those of the NumPy metrics.
    for make in (M.Sum, M.Max, M.Min, lambda: M.ConfusionMatrix(3),
                 lambda: M.Precision(num_classes=3, average="none"), M.Cat):
        metric = make()
        args = ((torch.zeros(0),) if not isinstance(metric, (M.ConfusionMatrix, M.Precision))
                else (torch.zeros((0, 3)), torch.zeros(0, dtype=torch.int64)))
        metric.update(*args)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            assert same_value(metric.compute(), make().compute()) == [], type(metric).__name__
    # Plain Python values carry no home: they join the metric's.
    total = M.Sum()
    total.update(torch.ones(2))
    total.update([1.0, 2.0])
    total.update(3)
    assert total.compute() == 8.0
    assert isinstance(total._synced["totals"], torch.Tensor)
    wmean = M.WeightedMean()
    wmean.update(torch.tensor([1.0, 3.0]), [3.0, 1.0])
    assert wmean.compute() == pytest.approx(1.5)
    # A fresh metric fed plain values only is a NumPy metric, as before.
    plain = M.Sum()
    plain.update([1.0, 2.0])
    assert isinstance(plain._synced["totals"], np.ndarray)
    # Inputs requiring gradients are read without them.
    cat = M.Cat()
    cat.update(torch.ones(3, requires_grad=True))
    assert not cat.compute().requires_grad and cat.compute().tolist() == [1.0, 1.0, 1.0]


def test_cat_casts_and_splits_rows_in_the_home(torch):
    cat = M.Cat(np.int32, item_shape=(2,))
    cat.update(torch.arange(6, dtype=torch.int64).reshape(3, 2))
    cat.update(torch.tensor([[7.9, 8.0]]))
    got = cat.compute()
    assert isinstance(got, torch.Tensor) and got.dtype == torch.int32
    assert got.tolist() == [[0, 1], [2, 3], [4, 5], [7, 8]]
    with pytest.raises(ValueError, match=r"rows of shape \(2,\)"):
        cat.update(torch.zeros(3))
    source = torch.zeros(2)
    cat = M.Cat()
    cat.update(source)
    source += 1  # the metric keeps a copy
    assert cat.compute().tolist() == [0.0, 0.0]


def test_accuracy_label_path_in_the_home(torch):
    acc = M.Accuracy("multiclass", num_classes=3)
    acc.update(torch.tensor([0, 1, 2, 2], dtype=torch.int32), torch.tensor([0, 2, 2, 1]))
    acc.update(torch.tensor([True, False]), torch.tensor([1, 0], dtype=torch.uint8))
    assert isinstance(acc._window["correct"], torch.Tensor)
    assert acc.compute() == pytest.approx(4 / 6)
    # On the host, labels are checked as for NumPy; the state is untouched.
    with pytest.raises(ValueError, match=r"outside \[0, 3\)"):
        acc.update(torch.tensor([0, 3]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="integer dtype"):
        acc.update(torch.tensor([0.0, 1.0]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"\(N,\)"):
        acc.update(torch.tensor([0, 1]), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="top_k"):
        M.Accuracy("multiclass", num_classes=3, top_k=2).update(torch.tensor([0]),
                                                                torch.tensor([0]))
    assert acc.state_dict()["window"]["correct"].tolist() == [4, 6]
    # What a GPU runs (its labels never read on the host): samples with a
    # label outside [0, C) are skipped, as the CUDA kernels skip them.
    import array_api_compat

    xp = array_api_compat.array_namespace(torch.zeros(1))
    counts = acc._count_labels(xp, torch.tensor([0, 5, 2, -1, 1, 2]),
                               torch.tensor([0, 1, 2, 0, 3, 1]))
    assert counts.tolist() == [2, 3]


def test_mixing_homes_raises_before_writing(torch):
    d = base.dataset()
    numpy_part = {k: v[:50] for k, v in d.items()}
    torch_part = as_torch(torch, numpy_part)
    metrics = base.make_metrics()
    base.update(metrics, torch_part, slice(0, 50))
    for name, metric in metrics.items():
        before = metric.state_dict()
        with pytest.raises(ValueError, match=r"inputs are NumPy arrays \(host\) but the states "
                                             r"are torch arrays on cpu"):
            base.update({**{n: _Refuse() for n in metrics}, name: metric}, numpy_part,
                        slice(0, 50))
        assert base.states_equal(metric.state_dict(), before), name
        metric.reset()  # keeps the home
        assert all(isinstance(a, torch.Tensor) for a in state_arrays(metric)), name
        with pytest.raises(ValueError, match="torch arrays on cpu"):
            base.update({**{n: _Refuse() for n in metrics}, name: metric}, numpy_part,
                        slice(0, 50))
    # In one update, NumPy arrays beside torch CPU tensors are host data
    # that joins the torch home (the kernels read both where they are).
    cm = M.ConfusionMatrix(3)
    cm.update(torch.tensor([[0.1, 0.8, 0.1]]), np.array([1]))
    assert isinstance(cm.compute(), torch.Tensor) and cm.compute()[1, 1] == 1
    with pytest.raises(ValueError, match=r"inputs are NumPy arrays \(host\) but the states are "
                                         r"torch arrays on cpu"):
        cm.update(np.zeros((2, 3)), np.zeros(2, np.int64))
    acc = M.Accuracy("multiclass", num_classes=3)
    acc.update(torch.tensor([0, 1]), np.array([0, 2], np.int8))
    acc.update([2], torch.tensor([2]))
    assert isinstance(acc._window["correct"], torch.Tensor) and acc.compute() == pytest.approx(2 / 3)
    # A NumPy metric refuses torch tensors, alone or beside NumPy arrays.
    cm = M.ConfusionMatrix(3)
    cm.update(np.zeros((2, 3)), np.zeros(2, np.int64))
    for target in (torch.zeros(2, dtype=torch.int64), np.zeros(2, np.int64)):
        with pytest.raises(ValueError, match=r"inputs are torch arrays on cpu but the states are "
                                             r"NumPy arrays \(host\)"):
            cm.update(torch.zeros((2, 3)), target)
    assert isinstance(cm.compute(), np.ndarray) and cm.compute()[0, 0] == 2


def test_device_inputs_refuse_host_data_and_other_devices(torch, monkeypatch):
    """Device arrays (torch tensors marked as if on a GPU: only where they
    are is read before the refusal) never mix with host data."""
    from concord.metrics import base as metrics_base

    real_is_host, real_device = metrics_base.is_host, metrics_base.array_device

    def on_gpu(x):
        return getattr(x, "_as_if_on_gpu", False)

    class NoCache(dict):  # homes are cached by array type and device: the fake shares both
        def __setitem__(self, key, value):
            pass

    monkeypatch.setattr(metrics_base, "_homes", NoCache())
    monkeypatch.setattr(metrics_base, "is_host", lambda x: not on_gpu(x) and real_is_host(x))
    monkeypatch.setattr(metrics_base, "array_device",
                        lambda x: "cuda:0" if on_gpu(x) else real_device(x))
    scores = torch.zeros((2, 3))
    scores._as_if_on_gpu = True
    cm = M.ConfusionMatrix(3)
    for target, other in ((np.zeros(2, np.int64), r"NumPy arrays \(host\)"),
                          (torch.zeros(2, dtype=torch.int64), "torch arrays on cpu")):
        with pytest.raises(ValueError, match=rf"mix torch arrays on cuda:0 and {other}"):
            cm.update(scores, target)
    assert cm._home is None


class _Refuse:
    """Stands in for the metrics a test does not feed."""

    def update(self, *args, **kwargs):
        pass


def test_collection_checks_every_member_before_updating(torch):
    collection = M.MetricCollection({"a": M.Sum(), "b": M.Mean(), "c": M.Max()})
    collection["b"].update(np.ones(2))
    with pytest.raises(ValueError, match="torch arrays on cpu"):
        collection.update(torch.ones(3))
    assert collection["a"]._home is None and collection["c"]._home is None
    assert collection.compute()["a"] == 0.0
    # Members on different homes: each computes in its own.
    collection["a"].update(torch.ones(3))
    assert isinstance(collection["a"]._synced["totals"], torch.Tensor)
    assert collection.compute() == {"a": 3.0, "b": 1.0, "c": -np.inf}


def test_state_dict_round_trips_exactly_into_a_torch_home(torch, tmp_path):
    d = base.dataset()
    first, second = slice(0, 100), slice(100, base.N)
    dt = as_torch(torch, d)
    run = base.make_metrics()
    base.update(run, dt, first)
    state = {name: metric.state_dict() for name, metric in run.items()}
    # Into metrics already living in torch: exact, and still torch.
    loaded = base.make_metrics()
    base.update(loaded, dt, second)
    for name, metric in loaded.items():
        metric.load_state_dict(state[name])
        assert all(isinstance(a, torch.Tensor) for a in state_arrays(metric)), name
        assert base.states_equal(metric.state_dict(), state[name]), name
    # Saved with np.savez and loaded into fresh metrics (NumPy until their
    # first update, which moves the loaded data to torch: nothing lost).
    cm = state["cm"]
    np.savez(tmp_path / "cm.npz", synced=cm["synced"]["confusion"],
             window=cm["window"]["confusion"])
    with np.load(tmp_path / "cm.npz") as saved:
        state["cm"] = {"synced": {"confusion": saved["synced"]},
                       "window": {"confusion": saved["window"]}}
    fresh = base.make_metrics()
    for name, metric in fresh.items():
        metric.load_state_dict(state[name])
        assert all(isinstance(a, np.ndarray) for a in state_arrays(metric)), name
    base.update(fresh, dt, second)
    base.update(run, dt, second)
    for name, metric in fresh.items():
        assert all(isinstance(a, torch.Tensor) for a in state_arrays(metric)), name
    assert compare(quiet_compute(fresh), quiet_compute(run)) == []
    # Torch tensors are accepted as state_dict values too, and checked.
    sd = run["sum"].state_dict()
    run["sum"].load_state_dict({part: {k: torch.from_numpy(v) for k, v in sd[part].items()}
                                for part in ("synced", "window")})
    assert base.states_equal(run["sum"].state_dict(), sd)
    with pytest.raises(ValueError, match="expected"):
        run["sum"].load_state_dict({"synced": {"totals": torch.zeros(3)},
                                    "window": {"totals": torch.zeros(2)}})


def test_to_host_copies(torch):
    a = np.arange(4.0)
    copy = to_host(a)
    assert copy is not a and not np.shares_memory(copy, a)
    t = torch.arange(4.0, requires_grad=True)
    host = to_host(t)
    assert type(host) is np.ndarray and host.tolist() == [0.0, 1.0, 2.0, 3.0]
    plain = torch.arange(3)
    host = to_host(plain)
    plain += 10
    assert host.tolist() == [0, 1, 2]
    assert to_host([1, 2]).tolist() == [1, 2] and to_host(np.float32(2)).dtype == np.float32
    assert to_host(torch.zeros((2, 3)).T).shape == (3, 2)


class _FakeCudaArray:
    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA


def test_the_sync_signature_tells_host_from_gpu_states(torch):
    spec = StateSpec("sum", (2,), np.dtype(np.float64))
    on_host = _signature([Entry(("m", "s"), spec, np.zeros(2))])
    assert _signature([Entry(("m", "s"), spec, torch.zeros(2, dtype=torch.float64))]) == on_host
    assert _signature([Entry(("m", "s"), spec, _FakeCudaArray())]) != on_host
    assert device_key(_FakeCudaArray()) == ("cuda", 0)
    assert device_key(np.zeros(1)) == device_key(torch.zeros(1)) == device_key(1.5) == ("cpu", 0)


# ---------------------------------------------------------------- multi-rank
# Ranks send torch tensors back as tagged NumPy copies: pickled for
# multiprocessing, a tensor would share memory with a rank about to exit.

_TAG = "torch tensor"


def portable(tree):
    import torch

    def leaf(value):
        if not isinstance(value, torch.Tensor):
            return value
        wide = value.float() if value.dtype == torch.bfloat16 else value
        return (_TAG, str(value.dtype).split(".")[-1], wide.numpy().copy())

    return optree.tree_map(leaf, tree, none_is_leaf=True)


def revive(tree):
    import torch

    def leaf(value):
        if isinstance(value, tuple) and len(value) == 3 and value[0] == _TAG:
            return torch.from_numpy(value[2]).to(getattr(torch, value[1]))
        return value

    return optree.tree_map(leaf, tree, none_is_leaf=True,
                           is_leaf=lambda v: isinstance(v, tuple) and v[:1] == (_TAG,))



def torch_synced_values():
    """test_metrics' metrics fed torch tensors, synced in one collection and
    one by one; with the type of every state and result."""
    import torch

    comm = cc.init()
    dt = as_torch(torch, base.dataset())
    part = base.rank_slice(comm.rank, comm.size)
    together = M.MetricCollection(base.make_metrics())
    base.update_in_two(together, dt, part)
    together.sync()
    alone = base.make_metrics()
    base.update_in_two(alone, dt, part)
    for metric in alone.values():
        metric.trigger_sync()
        metric.wait_sync()
    # A second window on top of the synced state (reusing its arrays), empty here.
    together.sync()
    all_torch = all(isinstance(a, torch.Tensor) for m in (*together.values(), *alone.values())
                    for a in state_arrays(m))
    return all_torch, portable(quiet_compute(together)), portable(quiet_compute(alone))


@pytest.mark.parametrize("nprocs", [1, 2, 3])
def test_torch_states_sync_like_numpy(torch, nprocs):
    ref = base.references()
    numpy_fed = base.make_metrics()
    base.update(numpy_fed, base.dataset(), slice(0, base.N))
    expected = quiet_compute(numpy_fed)
    for rank, (all_torch, together, alone) in enumerate(
            revive(cc.launch(torch_synced_values, nprocs))):
        assert all_torch, f"rank {rank}"
        for label, values in (("collection", together), ("one by one", alone)):
            assert base.mismatches(values, ref) == [], f"rank {rank}, {label}"
            # Sums over ranks may round differently from one sum over all.
            exact = {k: v for k, v in expected.items() if k not in ("sum", "mean", "wmean")}
            assert compare(values, exact) == [], f"rank {rank}, {label}"


def mixed_homes_checks():
    """A collection of NumPy, torch and homeless members; Cat states of odd
    dtypes and row sizes on both homes; a sync before any update."""
    import torch

    comm = cc.init()
    rank = comm.rank
    rng = np.random.default_rng([7, rank])
    collection = M.MetricCollection({
        "x_ids": M.Cat(np.int32), "x_max": M.Max(),
        "t_rows": M.Cat(np.float64, item_shape=(3,)), "t_flags": M.Cat(np.uint8),
        "t_sum": M.Sum(), "t_cm": M.ConfusionMatrix(3), "t_late": M.Mean(),
        "idle": M.Min(),
    })
    collection.sync()  # homeless: NumPy states synced on the host
    data = {"ids": rng.integers(0, 100, rank + 2).astype(np.int32),
            "values": rng.normal(size=2 * rank + 1),
            "rows": rng.normal(size=(rank + 1, 3)),
            "flags": rng.integers(0, 2, 3 * rank + 1).astype(np.uint8),
            "scores": rng.normal(size=(4, 3)).astype(np.float32),
            "target": rng.integers(0, 3, 4)}
    collection["x_ids"].update(data["ids"])
    collection["x_max"].update(data["values"])
    collection["t_rows"].update(torch.from_numpy(data["rows"]))
    collection["t_flags"].update(torch.from_numpy(data["flags"]))
    collection["t_sum"].update(torch.from_numpy(data["values"]))
    collection["t_cm"].update(torch.from_numpy(data["scores"]), torch.from_numpy(data["target"]))
    collection.sync()
    collection["t_late"].update(torch.from_numpy(data["values"]))  # after a sync: moved to torch
    collection["t_sum"].update(torch.ones(1))
    collection.sync()
    homes = {name: type(state_arrays(m)[0]).__module__.split(".")[0]
             for name, m in collection.items()}
    return data, homes, portable(quiet_compute(collection))


@pytest.mark.parametrize("nprocs", [2, 3])
def test_collections_of_mixed_homes_sync_per_device(torch, nprocs):
    results = revive(cc.launch(mixed_homes_checks, nprocs))
    data = [r[0] for r in results]
    every = {key: np.concatenate([d[key] for d in data]) for key in data[0]}
    argmax = every["scores"].argmax(1)
    expected = {
        "x_ids": every["ids"], "x_max": every["values"].max(),
        "t_rows": every["rows"], "t_flags": every["flags"],
        "t_sum": every["values"].sum() + nprocs, "t_cm": base.ref_confusion(every["target"],
                                                                            argmax, 3),
        "t_late": every["values"].mean(), "idle": np.inf,
    }
    for rank, (_, homes, values) in enumerate(results):
        assert homes == {"x_ids": "numpy", "x_max": "numpy", "t_rows": "torch",
                         "t_flags": "torch", "t_sum": "torch", "t_cm": "torch",
                         "t_late": "torch", "idle": "numpy"}, f"rank {rank}"
        assert values["t_rows"].dtype == torch.float64 and values["t_flags"].dtype == torch.uint8
        assert values["x_ids"].dtype == np.int32
        assert base.mismatches(values, expected) == [], f"rank {rank}"


def torch_functional_checks():
    import torch

    comm = cc.init()
    rank = comm.rank
    base_grid = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    tree = {"grid_t": (base_grid * (rank + 1)).T,  # not contiguous
            "half": torch.full((3,), float(rank + 1), dtype=torch.bfloat16),
            "flags": torch.tensor([rank % 2 == 0, True]),
            "ints": torch.tensor([rank, 10 * rank + 1], dtype=torch.int32),
            "np": np.full(2, rank, np.float32), "py": rank}
    before = {k: v.clone() for k, v in tree.items() if isinstance(v, torch.Tensor)}
    return portable((M.reduce_sum(tree), M.reduce_mean(tree), M.reduce_max(tree),
                     M.all_gather(tree), M.collect_from_devices({"ints": tree["ints"]}),
                     all(torch.equal(before[k], tree[k]) for k in before)))


@pytest.mark.parametrize("nprocs", [1, 2, 3])
def test_functional_reductions_of_torch_leaves(torch, nprocs):
    ranks = range(nprocs)
    grids = [np.arange(6.0).reshape(2, 3).T * (r + 1) for r in ranks]
    for summed, mean, largest, gathered, collected, untouched in revive(cc.launch(
            torch_functional_checks, nprocs)):
        assert untouched
        assert isinstance(summed["grid_t"], torch.Tensor)
        assert summed["grid_t"].tolist() == sum(grids).tolist()
        assert summed["half"].dtype == torch.bfloat16
        assert summed["half"].float().tolist() == [sum(r + 1.0 for r in ranks)] * 3
        assert summed["flags"].dtype == torch.int64
        assert summed["flags"].tolist() == [sum(r % 2 == 0 for r in ranks), nprocs]
        assert mean["flags"].dtype == torch.float64
        assert mean["ints"].dtype == torch.int32
        assert mean["ints"].tolist() == [int(np.trunc(np.mean(list(ranks)))),
                                         int(np.trunc(np.mean([10 * r + 1 for r in ranks])))]
        assert largest["grid_t"].tolist() == grids[-1].tolist()
        assert type(summed["np"]) is np.ndarray and summed["py"] == sum(ranks)
        assert isinstance(gathered["grid_t"], torch.Tensor)
        assert gathered["grid_t"].tolist() == [g.tolist() for g in grids]
        assert gathered["half"].shape == (nprocs, 3) and gathered["half"].dtype == torch.bfloat16
        assert [c.tolist() for c in collected["ints"]] == [[r, 10 * r + 1] for r in ranks]
