"""The CUDA kernels against the CPU executors, which are the reference.

Every case runs the same public call twice on the same fresh random data:
once with NumPy arrays on the CPU, once with torch CUDA tensors; the results
must agree (tightly for float32 and float64, exactly for integer counts).
Calls on CUDA tensors are asynchronous on the current stream; the results
are read back on that stream (or after synchronising it). Each failure
message carries the seed of its data.
"""

import numpy as np
import optree
import pytest

import concord as cc
from concord import metrics as M
from concord import optim
from concord.training import GradientSynchronizer
from helpers import delay, host

pytestmark = pytest.mark.gpu

LARGE = 1000003
# CPU and GPU run the same per-element arithmetic; they may differ by
# contraction into fused multiply-adds (an ulp or so per operation).
OPTIM_TOLERANCE = {"float32": dict(rtol=1e-6, atol=1e-6),
                   "float64": dict(rtol=1e-12, atol=1e-12)}


def odd_shapes(rng):
    """Edge shapes (empty, 0-d, vector tails, a large one) and many odd sizes."""
    shapes = [(), (0,), (1,), (7,), (33, 5), (3, 4, 5), (129,), (4097,), (17, 31), (LARGE,)]
    shapes += [(int(n),) for n in rng.integers(1, 5000, 30)]
    shapes += [tuple(int(d) for d in rng.integers(1, 40, 2)) for _ in range(10)]
    return shapes


def random_arrays(rng, shapes, dtype):
    return [np.asarray(rng.standard_normal(shape)).astype(dtype) for shape in shapes]


def to_cuda(torch, arrays):
    return [torch.from_numpy(np.array(a, copy=True)).cuda() for a in arrays]


def assert_leaves_close(torch, label, got, expected, dtype, seed):
    got_leaves, expected_leaves = optree.tree_leaves(got), optree.tree_leaves(expected)
    assert len(got_leaves) == len(expected_leaves), f"seed {seed}: {label}: leaf count"
    for i, (g, e) in enumerate(zip(got_leaves, expected_leaves)):
        where = f"seed {seed}: {label} leaf {i} of shape {e.shape}"
        assert type(g) is torch.Tensor and g.is_cuda, f"{where}: got a {type(g).__name__}"
        assert str(g.dtype) == f"torch.{dtype}", f"{where}: dtype {g.dtype}"
        np.testing.assert_allclose(host(g), e, err_msg=where, **OPTIM_TOLERANCE[dtype])


# ---- optimizers --------------------------------------------------------------------

OPTIMIZERS = {
    "sgd": lambda: optim.SGD(0.05),
    "sgd-weight-decay": lambda: optim.SGD(0.05, weight_decay=0.05),
    "sgd-momentum": lambda: optim.SGD(0.05, momentum=0.9),
    "sgd-nesterov": lambda: optim.SGD(0.05, momentum=0.9, nesterov=True),
    "sgd-nesterov-weight-decay": lambda: optim.SGD(0.05, momentum=0.5, nesterov=True,
                                                   weight_decay=0.1),
    "adamw": lambda: optim.AdamW(1e-2),
    "adamw-custom": lambda: optim.AdamW(1e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.0),
    "adamw-schedule": lambda: optim.AdamW(lambda step: 1e-2 / step, weight_decay=0.1),
}
STEPS = 5


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_step_matches_cpu(torch_cuda, seed, rng, name, dtype):
    torch = torch_cuda
    shapes = odd_shapes(rng)
    params = random_arrays(rng, shapes, dtype)
    params_gpu = to_cuda(torch, params)
    opt, opt_gpu = OPTIMIZERS[name](), OPTIMIZERS[name]()
    state, state_gpu = opt.init(params), opt_gpu.init(params_gpu)
    for step in range(1, STEPS + 1):
        # The last step's gradients are all zero, an edge case.
        grads = (random_arrays(rng, shapes, dtype) if step < STEPS
                 else [np.zeros(s, dtype) for s in shapes])
        params, state = opt.step(params, grads, state)
        params_gpu, state_gpu = opt_gpu.step(params_gpu, to_cuda(torch, grads), state_gpu)
    assert state_gpu["step"] == state["step"] == STEPS
    assert_leaves_close(torch, f"{name} params", params_gpu, params, dtype, seed)
    for buffer in set(state) - {"step"}:
        assert_leaves_close(torch, f"{name} {buffer}", state_gpu[buffer], state[buffer], dtype,
                            seed)
    assert set(state_gpu) == set(state)


def test_optimizer_pytrees_on_cuda(torch_cuda, seed, rng):
    """A nested pytree of CUDA tensors: buffers are CUDA tensors shaped like
    the parameters, and the same pytree comes back."""
    torch = torch_cuda
    tree = {"dense": [rng.standard_normal((7, 5)), rng.standard_normal(0)],
            "head": (rng.standard_normal(()), None), "conv": rng.standard_normal((4, 3, 2))}
    tree = optree.tree_map(lambda a: np.asarray(a, np.float32), tree)
    tree_gpu = optree.tree_map(lambda a: torch.from_numpy(a.copy()).cuda(), tree)
    opt, opt_gpu = optim.AdamW(1e-2), optim.AdamW(1e-2)
    state, state_gpu = opt.init(tree), opt_gpu.init(tree_gpu)
    for _ in range(3):
        grads = optree.tree_map(lambda a: np.asarray(rng.standard_normal(a.shape), np.float32),
                                tree)
        tree, state = opt.step(tree, grads, state)
        returned, state_gpu = opt_gpu.step(
            tree_gpu, optree.tree_map(lambda a: torch.from_numpy(a).cuda(), grads), state_gpu)
        assert returned is tree_gpu
    assert optree.tree_structure(state_gpu["exp_avg"]) == optree.tree_structure(tree_gpu)
    assert_leaves_close(torch, "pytree params", tree_gpu, tree, "float32", seed)
    assert_leaves_close(torch, "pytree exp_avg_sq", state_gpu["exp_avg_sq"], state["exp_avg_sq"],
                        "float32", seed)


def test_optimizer_step_on_a_non_default_stream(torch_cuda, seed, rng):
    """Gradients written late on a stream, the step issued on that stream,
    the parameters read back on it: checked after synchronising it only."""
    torch = torch_cuda
    shapes = odd_shapes(rng)
    params = random_arrays(rng, shapes, "float32")
    params_gpu = to_cuda(torch, params)
    opt, opt_gpu = optim.SGD(0.05, momentum=0.9), optim.SGD(0.05, momentum=0.9)
    state, state_gpu = opt.init(params), opt_gpu.init(params_gpu)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    seen = []
    for _ in range(3):
        grads = random_arrays(rng, shapes, "float32")
        params, state = opt.step(params, grads, state)
        sources = to_cuda(torch, grads)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            grads_gpu = [torch.zeros_like(g) for g in sources]
            delay(torch)
            for g, src in zip(grads_gpu, sources):
                g.copy_(src)
                # Made on the current stream, read on `stream` after the
                # sleep: the next iteration drops `sources`, and its memory
                # must not be reused before `stream` has read it.
                src.record_stream(stream)
            params_gpu, state_gpu = opt_gpu.step(params_gpu, grads_gpu, state_gpu)
            seen = [p.clone() for p in params_gpu]
    stream.synchronize()
    assert_leaves_close(torch, "params read on the stream", seen, params, "float32", seed)


# ---- clip_grad_norm ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64", "mixed"])
@pytest.mark.parametrize("max_norm", [0.5, 1e9])
def test_clip_grad_norm_matches_cpu(torch_cuda, seed, rng, dtype, max_norm):
    torch = torch_cuda
    shapes = odd_shapes(rng)
    dtypes = (["float32", "float64"] * len(shapes))[:len(shapes)] if dtype == "mixed" \
        else [dtype] * len(shapes)
    grads = [np.asarray(rng.standard_normal(s)).astype(d) for s, d in zip(shapes, dtypes)]
    grads_gpu = to_cuda(torch, grads)
    norm = optim.clip_grad_norm(grads, max_norm)
    norm_gpu = float(optim.clip_grad_norm(grads_gpu, max_norm))
    assert norm_gpu == pytest.approx(norm, rel=1e-9), f"seed {seed}"
    for i, (g, e, d) in enumerate(zip(grads_gpu, grads, dtypes)):
        where = f"seed {seed}: leaf {i} of shape {e.shape}"
        assert str(g.dtype) == f"torch.{d}", where
        if max_norm > norm:  # no clipping: untouched, bit for bit
            np.testing.assert_array_equal(host(g), e, err_msg=where)
        else:
            np.testing.assert_allclose(host(g), e, err_msg=where, **OPTIM_TOLERANCE[d])


def test_clip_grad_norm_edge_cases_on_cuda(torch_cuda):
    torch = torch_cuda
    assert float(optim.clip_grad_norm([torch.zeros(5, device="cuda")], 0.0)) == 0.0
    assert float(optim.clip_grad_norm([torch.zeros(0, device="cuda")], 1.0)) == 0.0
    grads = [torch.full((10,), 3.0, device="cuda"),
             torch.full((6,), 4.0, dtype=torch.float64, device="cuda")]
    assert float(optim.clip_grad_norm(grads, 100.0)) == pytest.approx(np.sqrt(90 + 96))
    norm = float(optim.clip_grad_norm(grads, 1.0))
    assert norm == pytest.approx(np.sqrt(90 + 96))
    total = sum(float((g.double() ** 2).sum()) for g in grads)
    assert np.sqrt(total) == pytest.approx(1.0, rel=1e-5)


def test_clip_grad_norm_on_a_non_default_stream(torch_cuda, seed, rng):
    torch = torch_cuda
    shapes = odd_shapes(rng)
    grads = random_arrays(rng, shapes, "float32")
    sources = to_cuda(torch, grads)
    norm = optim.clip_grad_norm(grads, 0.5)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        grads_gpu = [torch.zeros_like(g) for g in sources]
        delay(torch)
        for g, src in zip(grads_gpu, sources):
            g.copy_(src)
        norm_gpu = optim.clip_grad_norm(grads_gpu, 0.5)
        seen = [g.clone() for g in grads_gpu]
    stream.synchronize()
    assert float(norm_gpu) == pytest.approx(norm, rel=1e-9), f"seed {seed}"
    assert_leaves_close(torch, "clipped grads read on the stream", seen, grads, "float32", seed)


# ---- scale and sums of squares, every floating dtype ---------------------------------


def _floating_leaves(torch, rng):
    """Float16, bfloat16, float32 and float64 leaves of odd shapes, as NumPy
    float32/float64 (the CPU side) and torch CUDA tensors of the same values."""
    shapes = odd_shapes(rng)
    kinds = (["float16", "bfloat16", "float32", "float64"] * len(shapes))[:len(shapes)]
    cpu, gpu = [], []
    for shape, kind in zip(shapes, kinds):
        values = np.asarray(rng.standard_normal(shape))
        tensor = torch.from_numpy(values).to(getattr(torch, kind)).cuda()
        gpu.append(tensor)
        cpu.append(tensor.cpu() if kind == "bfloat16" else host(tensor))
    return cpu, gpu, kinds


def test_scale_and_sum_of_squares_match_cpu(torch_cuda, seed, rng):
    from concord import _capi
    torch = torch_cuda
    cpu, gpu, kinds = _floating_leaves(torch, rng)
    expected = _capi.sum_of_squares(cpu)
    assert _capi.sum_of_squares(gpu) == pytest.approx(expected, rel=1e-12), f"seed {seed}"
    into = torch.full((1,), -1.0, dtype=torch.float64, device="cuda")
    _capi.sum_of_squares_into(gpu, into)
    assert float(into) == pytest.approx(expected, rel=1e-12), f"seed {seed}"
    _capi.scale(cpu, 0.37)
    _capi.scale(gpu, 0.37)
    for i, (g, e, kind) in enumerate(zip(gpu, cpu, kinds)):
        where = f"seed {seed}: {kind} leaf {i}"
        assert str(g.dtype) == f"torch.{kind}", where
        # The same arithmetic (float32 for the 16-bit types) rounded once.
        np.testing.assert_array_equal(host(g), host(e), err_msg=where)


# ---- gradient buckets (pack, reduce, unpack) ------------------------------------------


@pytest.mark.parametrize("compress", [None, "bf16", "fp16"])
def test_gradient_synchronizer_matches_cpu(torch_cuda, world1, seed, rng, compress):
    """On a world of one the mean is the gradient itself, after the wire
    cast when compressed; CPU and GPU round alike."""
    torch = torch_cuda
    shapes = odd_shapes(rng)
    grads = random_arrays(rng, shapes, "float32")
    grads_gpu = to_cuda(torch, grads)
    options = dict(bucket_cap_mb=1, first_bucket_mb=0.25, compress=compress)
    with GradientSynchronizer(grads, **options) as sync:
        expected = sync.synchronize([g.copy() for g in grads])
    with GradientSynchronizer(grads_gpu, **options) as sync:
        for _ in range(2):  # a second step reuses the buckets
            got = sync.synchronize([g.clone() for g in grads_gpu])
    tolerance = dict(rtol=0, atol=0) if compress is None else dict(rtol=1e-6, atol=1e-30)
    for i, (g, e) in enumerate(zip(got, expected)):
        where = f"seed {seed}: compress={compress} leaf {i} of shape {e.shape}"
        assert type(g) is torch.Tensor and g.is_cuda, where
        np.testing.assert_allclose(host(g), e, err_msg=where, **tolerance)


# ---- metrics -------------------------------------------------------------------------

C = 5       # classes
L = 4       # labels
BATCHES = (1000, 0, 7)  # samples per update: an empty update among them


def metric_data(rng, n, score_dtype, label_dtype):
    """One batch of every kind of input, NumPy on the CPU side; scores in
    score_dtype (bfloat16 ones as float32, cast by the caller)."""
    values = rng.normal(size=n)
    with_nans = values.copy()
    with_nans[rng.random(n) < 0.1] = np.nan
    probs = rng.random(n)
    probs[:min(n, 4)] = [0.0, 0.5, 1.0, 0.25][:min(n, 4)]  # threshold and bin edges
    carrier = "float32" if score_dtype == "bfloat16" else score_dtype
    return {
        "values": values.astype(carrier),
        "weights": rng.uniform(0, 2, n),
        "with_nans": with_nans.astype(carrier),
        "scores": rng.normal(size=(n, C)).astype(carrier),
        "target": rng.integers(0, C, n).astype(label_dtype),
        "label_preds": rng.integers(0, C, n).astype(label_dtype),
        "probs": probs.astype(carrier),
        "binary_target": rng.integers(0, 2, n).astype(label_dtype),
        "binary_preds": rng.integers(0, 2, n).astype(label_dtype),
        "ml_probs": rng.random((n, L)).astype(carrier),
        "ml_target": rng.integers(0, 2, (n, L)).astype(label_dtype),
    }


FLOAT_INPUTS = ("values", "with_nans", "scores", "probs", "ml_probs")

# name -> (make the metric, the inputs of update(), how exactly results agree)
EXACT = dict(rtol=0, atol=0)
SUMS = dict(rtol=1e-10, atol=1e-10)
METRICS = {
    "Sum": (M.Sum, ("values",), SUMS),
    "Mean": (M.Mean, ("values",), SUMS),
    "WeightedMean": (M.WeightedMean, ("values", "weights"), SUMS),
    "Max": (M.Max, ("with_nans",), EXACT),
    "Min": (M.Min, ("with_nans",), EXACT),
    "Cat": (M.Cat, ("values",), EXACT),
    "Accuracy-scores": (lambda: M.Accuracy("multiclass", num_classes=C), ("scores", "target"),
                        EXACT),
    "Accuracy-top2": (lambda: M.Accuracy("multiclass", num_classes=C, top_k=2),
                      ("scores", "target"), EXACT),
    "Accuracy-labels": (lambda: M.Accuracy("multiclass", num_classes=C),
                        ("label_preds", "target"), EXACT),
    "Accuracy-binary": (lambda: M.Accuracy("binary"), ("probs", "binary_target"), EXACT),
    "Accuracy-binary-labels": (lambda: M.Accuracy("binary"), ("binary_preds", "binary_target"),
                               EXACT),
    "Accuracy-multilabel": (lambda: M.Accuracy("multilabel", num_classes=L, threshold=0.3),
                            ("ml_probs", "ml_target"), EXACT),
    "ConfusionMatrix-scores": (lambda: M.ConfusionMatrix(C), ("scores", "target"), EXACT),
    "ConfusionMatrix-labels": (lambda: M.ConfusionMatrix(C), ("label_preds", "target"), EXACT),
    "ConfusionMatrix-binary": (lambda: M.ConfusionMatrix(task="binary"),
                               ("probs", "binary_target"), EXACT),
    "ConfusionMatrix-multilabel": (lambda: M.ConfusionMatrix(L, task="multilabel"),
                                   ("ml_probs", "ml_target"), EXACT),
    **{f"{cls.__name__}-{average}": (
        lambda cls=cls, average=average: cls(num_classes=C, average=average),
        ("scores", "target"), EXACT)
       for cls in (M.Precision, M.Recall, M.F1Score)
       for average in ("micro", "macro", "weighted", "none")},
    "FBetaScore-labels-macro": (lambda: M.FBetaScore(2.0, num_classes=C, average="macro"),
                                ("label_preds", "target"), EXACT),
    "Precision-binary": (lambda: M.Precision("binary"), ("probs", "binary_target"), EXACT),
    "Recall-multilabel-micro": (lambda: M.Recall("multilabel", num_classes=L, average="micro"),
                                ("ml_probs", "ml_target"), EXACT),
    "F1Score-multilabel-macro": (
        lambda: M.F1Score("multilabel", num_classes=L, average="macro"),
        ("ml_probs", "ml_target"), EXACT),
    "BinaryAUROC": (lambda: M.BinaryAUROC(1000), ("probs", "binary_target"), EXACT),
}


def cpu_input(torch, array, key, score_dtype):
    """NumPy, except bfloat16 scores: a CPU torch tensor (NumPy has none)."""
    if key in FLOAT_INPUTS and score_dtype == "bfloat16":
        return torch.from_numpy(array).to(torch.bfloat16)
    return array


def gpu_input(torch, array, key, score_dtype):
    tensor = torch.from_numpy(np.array(array, order="C"))
    if key in FLOAT_INPUTS and score_dtype == "bfloat16":
        tensor = tensor.to(torch.bfloat16)
    return tensor.cuda()


def assert_same_result(label, got, expected, tolerance):
    got, expected = host(got), np.asarray(expected)
    assert got.shape == expected.shape, f"{label}: shape {got.shape} != {expected.shape}"
    np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64),
                               err_msg=label, equal_nan=True, **tolerance)


def feed_both(torch, rng, names, score_dtype, label_dtype, batches=BATCHES):
    """(cpu metrics, gpu metrics), each updated with the same batches."""
    cpu = {name: METRICS[name][0]() for name in names}
    gpu = {name: METRICS[name][0]() for name in names}
    for n in batches:
        d = metric_data(rng, n, score_dtype, label_dtype)
        for name in names:
            keys = METRICS[name][1]
            cpu[name].update(*(cpu_input(torch, d[k], k, score_dtype) for k in keys))
            gpu[name].update(*(gpu_input(torch, d[k], k, score_dtype) for k in keys))
    return cpu, gpu


@pytest.mark.parametrize("name", list(METRICS))
def test_metric_updates_match_cpu(torch_cuda, seed, rng, name):
    cpu, gpu = feed_both(torch_cuda, rng, [name], "float32", "int64")
    assert_same_result(f"seed {seed}: {name}", gpu[name].compute(), cpu[name].compute(),
                       METRICS[name][2])


# Input dtypes for the kernels that read scores or labels of every dtype.
DTYPE_CASES = [("float16", "int64"), ("bfloat16", "int64"), ("float64", "int64"),
               ("float32", "int32"), ("float32", "uint8"), ("float64", "int8")]
DTYPE_METRICS = ["Mean", "Max", "Accuracy-scores", "Accuracy-top2", "Accuracy-binary",
                 "ConfusionMatrix-scores", "ConfusionMatrix-labels", "ConfusionMatrix-multilabel",
                 "F1Score-macro", "BinaryAUROC"]


@pytest.mark.parametrize("score_dtype, label_dtype", DTYPE_CASES)
def test_metric_updates_over_input_dtypes(torch_cuda, seed, rng, score_dtype, label_dtype):
    cpu, gpu = feed_both(torch_cuda, rng, DTYPE_METRICS, score_dtype, label_dtype)
    for name in DTYPE_METRICS:
        assert_same_result(f"seed {seed}: {name} scores {score_dtype} labels {label_dtype}",
                           gpu[name].compute(), cpu[name].compute(), METRICS[name][2])


def test_bool_targets(torch_cuda, seed, rng):
    torch = torch_cuda
    probs = rng.random(1001)
    target = rng.integers(0, 2, 1001).astype(bool)
    for make in (lambda: M.Accuracy("binary"), lambda: M.ConfusionMatrix(task="binary"),
                 lambda: M.BinaryAUROC(100)):
        cpu, gpu = make(), make()
        cpu.update(probs, target)
        gpu.update(torch.from_numpy(probs).cuda(), torch.from_numpy(target).cuda())
        assert_same_result(f"seed {seed}: {type(cpu).__name__} bool target", gpu.compute(),
                           cpu.compute(), EXACT)


def test_large_confusion_matrix(torch_cuda, seed, rng):
    """1000 classes over 1000003 samples (many colliding counts)."""
    torch = torch_cuda
    preds = rng.integers(0, 1000, LARGE)
    target = rng.integers(0, 1000, LARGE)
    scores = rng.random((20011, 1000), dtype=np.float32)
    score_target = rng.integers(0, 1000, 20011)
    cpu, gpu = M.ConfusionMatrix(1000), M.ConfusionMatrix(1000)
    cpu_acc, gpu_acc = (M.Accuracy("multiclass", num_classes=1000, top_k=5) for _ in range(2))
    cpu.update(preds, target)
    cpu.update(scores, score_target)
    cpu_acc.update(scores, score_target)
    gpu.update(torch.from_numpy(preds).cuda(), torch.from_numpy(target).cuda())
    gpu.update(torch.from_numpy(scores).cuda(), torch.from_numpy(score_target).cuda())
    gpu_acc.update(torch.from_numpy(scores).cuda(), torch.from_numpy(score_target).cuda())
    assert_same_result(f"seed {seed}: ConfusionMatrix(1000)", gpu.compute(), cpu.compute(), EXACT)
    assert_same_result(f"seed {seed}: Accuracy top-5 of 1000", gpu_acc.compute(),
                       cpu_acc.compute(), EXACT)


def test_metric_sync_and_collection_on_cuda(torch_cuda, world1, seed, rng):
    """A collection updated with CUDA tensors, synced on a world of one,
    updated again: the same results as on the CPU."""
    torch = torch_cuda
    names = ["Mean", "Max", "Cat", "Accuracy-scores", "ConfusionMatrix-scores", "F1Score-macro",
             "BinaryAUROC"]
    cpu = M.MetricCollection({name: METRICS[name][0]() for name in names})
    gpu = M.MetricCollection({name: METRICS[name][0]() for name in names})
    for round_ in range(2):
        for n in (301, 17):
            d = metric_data(rng, n, "float32", "int64")
            for name in names:
                keys = METRICS[name][1]
                cpu[name].update(*(d[k] for k in keys))
                gpu[name].update(*(gpu_input(torch, d[k], k, "float32") for k in keys))
        cpu.sync()
        gpu.sync()
        expected, got = cpu.compute(), gpu.compute()
        for name in names:
            assert_same_result(f"seed {seed}: round {round_} {name}", got[name], expected[name],
                               METRICS[name][2])
    state = gpu["ConfusionMatrix-scores"].state_dict()
    reference = cpu["ConfusionMatrix-scores"].state_dict()
    np.testing.assert_array_equal(host(state["synced"]["confusion"]),
                                  reference["synced"]["confusion"])


def test_metric_updates_on_a_non_default_stream(torch_cuda, seed, rng):
    """Inputs written late on a stream, the update issued on that stream:
    the counts include the late data."""
    torch = torch_cuda
    d = metric_data(rng, 100003, "float32", "int64")
    cpu = M.ConfusionMatrix(C)
    cpu.update(d["scores"], d["target"])
    gpu = M.ConfusionMatrix(C)
    sources = [gpu_input(torch, d[k], k, "float32") for k in ("scores", "target")]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        inputs = [torch.zeros_like(s) for s in sources]
        delay(torch)
        for x, s in zip(inputs, sources):
            x.copy_(s)
        gpu.update(*inputs)
        result = gpu.compute()
    stream.synchronize()
    assert_same_result(f"seed {seed}: ConfusionMatrix on a stream", result, cpu.compute(), EXACT)


def test_cuda_and_cpu_inputs_do_not_mix(torch_cuda):
    torch = torch_cuda
    metric = M.ConfusionMatrix(C)
    with pytest.raises((cc.InvalidArgumentError, ValueError)):
        metric.update(torch.zeros((3, C), device="cuda"), torch.zeros(3, dtype=torch.int64))
