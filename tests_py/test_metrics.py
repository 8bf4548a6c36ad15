"""concord.metrics Metric classes against NumPy references written from the
definitions, on 1-4 ranks with data split unevenly (one rank empty).

Every rank generates the whole data set from SEED and updates with its own
slice; the parent computes the reference on the whole data set.
"""

import pickle
import warnings

import numpy as np
import pytest

import concord as cc
from concord import metrics as M

SEED = 777
N = 211      # samples in all, a prime
C = 5        # classes
L = 4        # labels
BINS = 1000


# ---------------------------------------------------------------- data


def dataset():
    rng = np.random.default_rng(SEED)
    probs = rng.random(N)
    probs[:7] = [0.0, 0.5, 1.0, 0.5, 0.25, 0.75, 1.0]  # threshold and bin edges
    return {
        "values": rng.normal(size=N),
        "weights": rng.uniform(0, 2, N),
        "scores": rng.normal(size=(N, C)).astype(np.float32),
        "target": rng.integers(0, C, N),
        # Labels never reach class C - 1: it is absent from target and preds.
        "label_preds": rng.integers(0, C - 1, N),
        "label_target": rng.integers(0, C - 1, N),
        "probs": probs,
        "binary_target": rng.integers(0, 2, N),
        # Label L - 1 occurs nowhere: never in the target, never predicted.
        "ml_probs": rng.random((N, L)) * np.array([1.0] * (L - 1) + [0.49]),
        "ml_target": rng.integers(0, 2, (N, L)) * np.array([1] * (L - 1) + [0]),
    }


def rank_slice(rank, size):
    """Uneven shares; rank 1 gets nothing."""
    shares = np.array([5, 0, 2, 3][:size] if size > 1 else [1], np.float64)
    bounds = np.concatenate([[0], np.floor(np.cumsum(shares) / shares.sum() * N)]).astype(int)
    bounds[-1] = N
    return slice(bounds[rank], bounds[rank + 1])


# ---------------------------------------------------------------- metrics


def make_metrics():
    return {
        "sum": M.Sum(), "mean": M.Mean(), "wmean": M.WeightedMean(), "max": M.Max(),
        "min": M.Min(), "cat": M.Cat(),
        "acc_top1": M.Accuracy("multiclass", num_classes=C),
        "acc_top2": M.Accuracy("multiclass", num_classes=C, top_k=2),
        "acc_labels": M.Accuracy("multiclass", num_classes=C),
        "acc_binary": M.Accuracy("binary"),
        "acc_multilabel": M.Accuracy("multilabel", num_classes=L),
        "cm": M.ConfusionMatrix(C), "cm_binary": M.ConfusionMatrix(task="binary"),
        "cm_multilabel": M.ConfusionMatrix(L, task="multilabel"),
        **{f"{kind}_{avg}": cls(num_classes=C, average=avg)
           for kind, cls in (("precision", M.Precision), ("recall", M.Recall), ("f1", M.F1Score))
           for avg in ("micro", "macro", "weighted", "none")},
        **{f"f2labels_{avg}": M.FBetaScore(2.0, num_classes=C, average=avg)
           for avg in ("micro", "macro", "weighted", "none")},
        "precision_binary": M.Precision("binary"), "recall_binary": M.Recall("binary"),
        "f1_multilabel_macro": M.F1Score("multilabel", num_classes=L, average="macro"),
        "recall_multilabel_micro": M.Recall("multilabel", num_classes=L, average="micro"),
        "auroc": M.BinaryAUROC(BINS),
    }


def update(ms, d, part):
    """Feeds one slice of the data set to every metric."""
    v, s, t = d["values"][part], d["scores"][part], d["target"][part]
    ms["sum"].update(v)
    ms["mean"].update(v)
    ms["wmean"].update(v, d["weights"][part])
    ms["max"].update(v)
    ms["min"].update(v)
    ms["cat"].update(v)
    ms["acc_top1"].update(s, t)
    ms["acc_top2"].update(s, t)
    ms["acc_labels"].update(d["label_preds"][part], d["label_target"][part])
    ms["acc_binary"].update(d["probs"][part], d["binary_target"][part])
    ms["acc_multilabel"].update(d["ml_probs"][part], d["ml_target"][part])
    ms["cm"].update(s, t)
    ms["cm_binary"].update(d["probs"][part], d["binary_target"][part])
    ms["cm_multilabel"].update(d["ml_probs"][part], d["ml_target"][part])
    for name, metric in ms.items():
        if name.split("_")[0] in ("precision", "recall", "f1") and name.endswith(
                ("micro", "macro", "weighted", "none")) and "multilabel" not in name:
            metric.update(s, t)
        elif name.startswith("f2labels"):
            metric.update(d["label_preds"][part], d["label_target"][part])
    ms["precision_binary"].update(d["probs"][part], d["binary_target"][part])
    ms["recall_binary"].update(d["probs"][part], d["binary_target"][part])
    ms["f1_multilabel_macro"].update(d["ml_probs"][part], d["ml_target"][part])
    ms["recall_multilabel_micro"].update(d["ml_probs"][part], d["ml_target"][part])
    ms["auroc"].update(d["probs"][part], d["binary_target"][part])


def update_in_two(ms, d, part):
    middle = (part.start + part.stop) // 2
    update(ms, d, slice(part.start, middle))
    update(ms, d, slice(middle, part.stop))


# ---------------------------------------------------------------- references


def ref_confusion(target, pred, classes):
    cm = np.zeros((classes, classes), np.int64)
    np.add.at(cm, (target, pred), 1)
    return cm


def ref_stats_multiclass(target, pred):
    cm = ref_confusion(target, pred, C)
    tp = np.diag(cm).astype(float)
    return tp, cm.sum(0) - tp, cm.sum(1) - tp


def ref_stats_multilabel(probs, target):
    pred = probs >= 0.5
    t = target.astype(bool)
    return ((pred & t).sum(0).astype(float), (pred & ~t).sum(0).astype(float),
            (~pred & t).sum(0).astype(float))


def divide(num, den):
    return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


def ref_score(kind, tp, fp, fn, average, beta=1.0, multilabel=False):
    """The documented definitions: NaN for a zero-division class; macro over
    classes that occur (over every label for multilabel), weighted by
    support, zero-division classes as 0."""
    b2 = beta ** 2
    num, den = {"precision": (tp, tp + fp), "recall": (tp, tp + fn),
                "f": ((1 + b2) * tp, (1 + b2) * tp + b2 * fn + fp)}[kind]
    if average == "micro":
        return float(divide(num.sum(), den.sum()))
    per_class = divide(num, den)
    if average == "none":
        return per_class
    filled = np.nan_to_num(per_class, nan=0.0)
    if average == "macro":
        weights = np.ones_like(tp) if multilabel else (tp + fp + fn > 0)
    else:
        weights = tp + fn
    return float(divide((weights * filled).sum(), weights.sum()))


def ref_auroc(scores, target):
    """P(positive's bin > negative's bin) + P(equal) / 2, over all pairs."""
    bins = np.minimum(np.floor(scores * BINS), BINS - 1)
    pos, neg = bins[target == 1], bins[target == 0]
    greater = (pos[:, None] > neg[None, :]).sum()
    ties = (pos[:, None] == neg[None, :]).sum()
    return (greater + ties / 2) / (len(pos) * len(neg))


def references():
    d = dataset()
    v, s, t = d["values"], d["scores"], d["target"]
    argmax = s.argmax(1)
    target_score = s[np.arange(N), t]
    better = (s > target_score[:, None]).sum(1)
    binary_pred = (d["probs"] >= 0.5).astype(int)
    ml_pred = (d["ml_probs"] >= 0.5).astype(int)
    ref = {
        "sum": v.sum(), "mean": v.mean(), "wmean": (v * d["weights"]).sum() / d["weights"].sum(),
        "max": v.max(), "min": v.min(), "cat": v,
        "acc_top1": np.mean(argmax == t), "acc_top2": np.mean(better < 2),
        "acc_labels": np.mean(d["label_preds"] == d["label_target"]),
        "acc_binary": np.mean(binary_pred == d["binary_target"]),
        "acc_multilabel": np.mean(ml_pred == d["ml_target"]),
        "cm": ref_confusion(t, argmax, C),
        "cm_binary": ref_confusion(d["binary_target"], binary_pred, 2),
        "cm_multilabel": np.stack([ref_confusion(d["ml_target"][:, j], ml_pred[:, j], 2)
                                   for j in range(L)]),
        "auroc": ref_auroc(d["probs"], d["binary_target"]),
    }
    stats = ref_stats_multiclass(t, argmax)
    label_stats = ref_stats_multiclass(d["label_target"], d["label_preds"])
    for avg in ("micro", "macro", "weighted", "none"):
        ref[f"precision_{avg}"] = ref_score("precision", *stats, avg)
        ref[f"recall_{avg}"] = ref_score("recall", *stats, avg)
        ref[f"f1_{avg}"] = ref_score("f", *stats, avg)
        ref[f"f2labels_{avg}"] = ref_score("f", *label_stats, avg, beta=2.0)
    bt = d["binary_target"]
    tp = float(((binary_pred == 1) & (bt == 1)).sum())
    ref["precision_binary"] = tp / (binary_pred == 1).sum()
    ref["recall_binary"] = tp / (bt == 1).sum()
    ml_stats = ref_stats_multilabel(d["ml_probs"], d["ml_target"])
    ref["f1_multilabel_macro"] = ref_score("f", *ml_stats, "macro", multilabel=True)
    ref["recall_multilabel_micro"] = ref_score("recall", *ml_stats, "micro", multilabel=True)
    return ref


def mismatches(values, ref):
    bad = []
    for name, expected in ref.items():
        actual = values[name]
        if not np.allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64),
                           rtol=1e-9, atol=1e-12, equal_nan=True) or (
                np.shape(actual) != np.shape(expected)):
            bad.append(f"{name}: {actual!r} != {expected!r}")
    return bad


def test_reference_covers_absent_classes():
    # The label data leaves class C - 1 out, so "none" has a NaN entry and
    # macro/weighted must skip it; the reference must exercise that.
    assert np.isnan(references()["f2labels_none"][-1])
    # The multilabel data leaves label L - 1 out, which multilabel macro
    # averages count as 0.
    tp, fp, fn = ref_stats_multilabel(dataset()["ml_probs"], dataset()["ml_target"])
    assert tp[-1] == fp[-1] == fn[-1] == 0 and (tp[:-1] > 0).all()


# ---------------------------------------------------------------- multi-rank


def synced_values():
    """Every metric synced in one collection, and again metric by metric."""
    comm = cc.init()
    d = dataset()
    part = rank_slice(comm.rank, comm.size)
    together = M.MetricCollection(make_metrics())
    update_in_two(together, d, part)
    together.sync()
    alone = make_metrics()
    update_in_two(alone, d, part)
    for metric in alone.values():
        metric.trigger_sync()
        metric.wait_sync()
    return together.compute(), {name: m.compute() for name, m in alone.items()}


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_metrics_match_numpy_on_uneven_ranks(nprocs):
    ref = references()
    for rank, (together, alone) in enumerate(cc.launch(synced_values, nprocs)):
        assert mismatches(together, ref) == [], f"rank {rank}, collection"
        assert mismatches(alone, ref) == [], f"rank {rank}, one by one"


def lifecycle_checks(checkpoint_dir):
    comm = cc.init()
    rank = comm.rank
    failures = []

    mean = M.Mean()
    try:
        mean.wait_sync()
        failures.append("wait_sync() without trigger_sync() did not raise")
    except RuntimeError:
        pass
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = mean.compute()
    if not (np.isnan(value) and any(issubclass(w.category, RuntimeWarning) for w in caught)):
        failures.append(f"compute() before update: {value}, warnings {caught}")

    # A new window after a sync sits on the synced totals, counted once.
    mean.update(np.full(3, rank + 1.0))
    mean.sync()
    mean.update(np.array([100.0 * (rank + 1)]))
    local_view = mean.compute()
    mean.sync()
    mean.sync()  # an empty window adds nothing
    size = comm.size
    first = [np.full(3, r + 1.0) for r in range(size)]
    second = [np.array([100.0 * (r + 1)]) for r in range(size)]
    expected = np.concatenate(first + second).mean()
    expected_local = np.concatenate(first + [second[rank]]).mean()
    if not (np.isclose(mean.compute(), expected) and np.isclose(local_view, expected_local)):
        failures.append(f"windows: {mean.compute()} vs {expected}, {local_view} vs {expected_local}")

    # Overlap: trigger, run collectives on another communicator, then wait.
    other = comm.split(0, rank)
    collection = M.MetricCollection({"sum": M.Sum(), "max": M.Max(), "cat": M.Cat(np.int64),
                                     "acc": M.Accuracy("binary")})
    collection["sum"].update(np.arange(rank + 1.0))
    collection["max"].update(np.array([float(rank)]))
    collection["cat"].update(np.arange(rank, dtype=np.int64))
    collection["acc"].update(np.array([0.9, 0.1]), np.array([1, rank % 2]))
    collection.trigger_sync()
    try:
        collection["sum"].update(np.ones(1))
        failures.append("update() between trigger and wait did not raise")
    except RuntimeError as exc:
        if "wait_sync()" not in str(exc):
            failures.append(f"unclear message: {exc}")
    for i in range(5):
        total = cc.all_reduce(np.full(1000, float(i)), comm=other)
        if total[0] != i * size:
            failures.append(f"overlapping all_reduce {i}: {total[0]}")
    collection.wait_sync()
    got = collection.compute()
    want = {"sum": sum(r * (r + 1) / 2 for r in range(size)), "max": size - 1.0,
            "cat": np.concatenate([np.arange(r) for r in range(size)]),
            "acc": (size + sum(1 - r % 2 for r in range(size))) / (2 * size)}
    if mismatches(got, want):
        failures.append(f"overlap: {mismatches(got, want)}")
    other.close()

    # Checkpoint halfway through a run: synced part and an unsynced window.
    d = dataset()
    part = rank_slice(rank, size)
    middle = (part.start + part.stop) // 2
    run = M.MetricCollection(make_metrics())
    update(run, d, slice(part.start, middle))
    run.sync()
    update(run, d, slice(middle, (middle + part.stop) // 2))
    state = run.state_dict()
    with open(checkpoint_dir / f"rank{rank}.pkl", "wb") as f:
        pickle.dump(state, f)
    copy = M.MetricCollection(make_metrics())
    copy.load_state_dict(pickle.loads(pickle.dumps(state)))
    if not states_equal(copy.state_dict(), state):
        failures.append("state_dict did not round-trip in process")
    update(run, d, slice((middle + part.stop) // 2, part.stop))
    run.sync()
    return failures, run.compute()


def states_equal(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(states_equal(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
    return a == b


def resume_from_checkpoint(checkpoint_dir):
    comm = cc.init()
    rank, size = comm.rank, comm.size
    with open(checkpoint_dir / f"rank{rank}.pkl", "rb") as f:
        state = pickle.load(f)
    run = M.MetricCollection(make_metrics())
    run.load_state_dict(state)
    exact = states_equal(run.state_dict(), state)
    d = dataset()
    part = rank_slice(rank, size)
    middle = (part.start + part.stop) // 2
    update(run, d, slice((middle + part.stop) // 2, part.stop))
    run.sync()
    return exact, run.compute()


@pytest.mark.parametrize("nprocs", [2, 3])
def test_lifecycle_overlap_and_checkpoint_resume(nprocs, tmp_path):
    results = cc.launch(lifecycle_checks, nprocs, tmp_path)
    assert [failures for failures, _ in results] == [[]] * nprocs
    ref = references()
    uninterrupted = [values for _, values in results]
    for values in uninterrupted:
        # Two syncs: Cat holds each sync's rows in rank order, so only the
        # multiset of values matches the data set.
        assert mismatches({**values, "cat": np.sort(values["cat"])},
                          {**ref, "cat": np.sort(ref["cat"])}) == []
    resumed = cc.launch(resume_from_checkpoint, nprocs, tmp_path)
    for (exact, values), original in zip(resumed, uninterrupted):
        assert exact
        assert mismatches(values, original) == []
        assert all(np.array_equal(values[k], original[k], equal_nan=True) for k in original)


def mismatched_sync(case):
    comm = cc.init()
    first = comm.rank == 0
    collections = {
        "missing": {"a": M.Mean(), **({"b": M.Sum()} if first else {})},
        "other_op": {"a": M.Max() if first else M.Min()},
        "cat_count": {"a": M.Cat(), **({"b": M.Cat()} if first else {})},
    }
    collection = M.MetricCollection(collections[case])
    try:
        collection.sync()
    except cc.MismatchError as exc:
        return "MismatchError", str(exc)
    return "no error", ""


@pytest.mark.parametrize("case", ["missing", "other_op", "cat_count"])
def test_mismatched_collections_raise_mismatch_error(case):
    for kind, message in cc.launch(mismatched_sync, 2, case):
        assert kind == "MismatchError"
        assert "metric states" in message


# ---------------------------------------------------------------- one process


def test_input_errors_are_value_errors_naming_the_shape():
    acc = M.Accuracy("multiclass", num_classes=3)
    with pytest.raises(ValueError, match=r"expected \(N, 3\)"):
        acc.update(np.zeros((4, 5), np.float32), np.zeros(4, np.int64))
    with pytest.raises(ValueError, match=r"outside \[0, 3\)"):
        acc.update(np.array([0, 3]), np.array([0, 1]))
    with pytest.raises(ValueError, match=r"\(N,\)"):
        acc.update(np.array([0, 1]), np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="outside"):
        M.ConfusionMatrix(3).update(np.array([0, 1]), np.array([0, 5]))
    with pytest.raises(ValueError, match="expected"):
        M.BinaryAUROC().update(np.zeros((2, 2)), np.array([0, 1]))
    with pytest.raises(ValueError, match="task"):
        M.Accuracy("ternary")
    with pytest.raises(ValueError, match="num_classes"):
        M.Precision("multiclass")
    with pytest.raises(ValueError, match="average"):
        M.Recall(num_classes=3, average="samples")
    with pytest.raises(ValueError, match="top_k"):
        M.Accuracy("binary", top_k=2)
    with pytest.raises(ValueError, match=r"rows of shape \(3,\)"):
        M.Cat(item_shape=(3,)).update(np.zeros(4))
    # A failed update leaves the state as it was.
    assert np.array_equal(acc.state_dict()["window"]["correct"], [0, 0])


def test_no_data_gives_nan_with_a_warning_and_auroc_one_half():
    for metric in (M.Mean(), M.WeightedMean(), M.Accuracy("binary"),
                   M.Precision(num_classes=3, average="macro"), M.F1Score("binary")):
        with pytest.warns(RuntimeWarning, match="returning NaN"):
            assert np.isnan(metric.compute())
    auroc = M.BinaryAUROC(10)
    auroc.update(np.array([0.2, 0.9]), np.array([1, 1]))
    with pytest.warns(RuntimeWarning, match="no positives or no negatives"):
        assert auroc.compute() == 0.5
    assert M.Sum().compute() == 0.0
    assert M.Max().compute() == -np.inf
    assert M.Cat().compute().shape == (0,)


def test_torch_inputs_and_exact_state_round_trip(tmp_path):
    torch = pytest.importorskip("torch")
    cm = M.ConfusionMatrix(4)
    cm.update(torch.tensor([[0.1, 0.7, 0.1, 0.1], [0.9, 0.0, 0.05, 0.05]]), torch.tensor([1, 2]))
    wmean = M.WeightedMean()
    wmean.update(torch.tensor([1.0, 2.0]), torch.tensor([3.0, 1.0]))
    assert cm.compute()[1, 1] == 1 and cm.compute()[2, 0] == 1
    assert wmean.compute() == pytest.approx(1.25)
    state = wmean.state_dict()
    np.savez(tmp_path / "wmean.npz", **{f"{part}.{k}": v for part in ("synced", "window")
                                         for k, v in state[part].items()})
    loaded = np.load(tmp_path / "wmean.npz")
    fresh = M.WeightedMean()
    fresh.load_state_dict({part: {k.split(".", 1)[1]: loaded[k] for k in loaded.files
                                  if k.startswith(part)} for part in ("synced", "window")})
    assert states_equal(fresh.state_dict(), state)
    with pytest.raises(ValueError, match="expected"):
        M.ConfusionMatrix(3).load_state_dict(cm.state_dict())
    with pytest.raises(ValueError, match="not a Mean"):
        M.Mean().load_state_dict(cm.state_dict())


def test_lifecycle_errors_on_a_world_of_one(world1):
    metric = M.Sum()
    metric.update(np.ones(2))
    metric.trigger_sync()
    for call in (lambda: metric.update(np.ones(1)), metric.compute, metric.reset,
                 metric.state_dict, metric.trigger_sync):
        with pytest.raises(RuntimeError, match="wait_sync"):
            call()
    metric.wait_sync()
    with pytest.raises(RuntimeError, match="without trigger_sync"):
        metric.wait_sync()
    with pytest.raises(RuntimeError, match="without trigger_sync"):
        M.MetricCollection({"s": M.Sum()}).wait_sync()
    assert metric.compute() == 2.0
    metric.reset()
    assert metric.compute() == 0.0
    with pytest.raises(ValueError, match="two names"):
        M.MetricCollection({"a": metric, "b": metric})


# ---------------------------------------------------------------- other libraries


def _multilabel_case(seed, n, labels):
    """Random multilabel data whose last label occurs nowhere and whose
    first is never predicted positive (a zero-division precision)."""
    rng = np.random.default_rng(seed)
    probs = rng.random((n, labels))
    target = rng.integers(0, 2, (n, labels))
    probs[:, -1] *= 0.49
    target[:, -1] = 0
    probs[:, 0] *= 0.49
    return probs, target


@pytest.mark.parametrize("n, labels", [(1, 3), (40, 3), (211, 6)])
def test_multilabel_scores_follow_scikit_learn_and_torchmetrics(seed, n, labels):
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    probs, target = _multilabel_case(seed, n, labels)
    preds = (probs >= 0.5).astype(int)
    kinds = {"precision": (M.Precision, sklearn_metrics.precision_score),
             "recall": (M.Recall, sklearn_metrics.recall_score),
             "f1": (M.F1Score, sklearn_metrics.f1_score)}
    try:
        import torchmetrics.functional.classification as tmf
        import torch
    except ImportError:  # compared with scikit-learn alone
        tmf = None
    for kind, (cls, reference) in kinds.items():
        for average in ("micro", "macro", "weighted", "none"):
            metric = cls("multilabel", num_classes=labels, average=average)
            metric.update(probs, target)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # NaN for zero division
                ours = np.nan_to_num(np.asarray(metric.compute(), np.float64), nan=0.0)
                expected = reference(target, preds, average=None if average == "none" else average,
                                     zero_division=0)
            assert np.allclose(ours, expected, rtol=1e-12, atol=1e-12), (kind, average, ours,
                                                                          expected)
            if tmf is not None:
                theirs = getattr(tmf, f"multilabel_{'f1_score' if kind == 'f1' else kind}")(
                    torch.from_numpy(probs), torch.from_numpy(target), num_labels=labels,
                    average=average).numpy()
                assert np.allclose(ours, theirs, rtol=1e-6, atol=1e-6), (kind, average, ours,
                                                                          theirs)
