"""concord.optim against NumPy references of torch's documented update rules
(torch.optim.SGD, torch.optim.AdamW, torch.nn.utils.clip_grad_norm_)."""

import collections

import numpy as np
import optree
import pytest

from concord import optim
from concord.errors import InvalidArgumentError

# Shapes with an empty leaf, a 0-d leaf and sizes that leave vector tails.
SHAPES = [(7, 5), (0,), (), (33,), (4, 3, 2)]
STEPS = 4
TOLERANCE = {"float32": dict(rtol=2e-5, atol=1e-6), "float64": dict(rtol=1e-12, atol=1e-13)}

Pair = collections.namedtuple("Pair", "first second")


def make_tree(rng, dtype):
    """A pytree with every container optree handles (and a None), leaves of SHAPES."""
    leaves = [rng.standard_normal(shape).astype(dtype) for shape in SHAPES]
    return {"dense": [leaves[0], leaves[1]], "misc": Pair(leaves[2], (leaves[3], None)),
            "conv": leaves[4]}


def like(tree, leaves):
    return optree.tree_unflatten(optree.tree_structure(tree), leaves)


def fresh_grads(rng, params, step):
    """New gradients every step; the last step's are all zero (an edge case)."""
    return like(params, [np.zeros_like(p) if step == STEPS
                         else rng.standard_normal(p.shape).astype(p.dtype)
                         for p in optree.tree_leaves(params)])


def reference_sgd(p, g, buf, step, lr, momentum, nesterov, weight_decay):
    """torch.optim.SGD (dampening 0) on one array, in place."""
    g = g + weight_decay * p
    if momentum:
        buf[...] = g if step == 1 else momentum * buf + g
        g = g + momentum * buf if nesterov else buf
    p -= lr * g


def reference_adamw(p, g, m, v, step, lr, betas, eps, weight_decay):
    """torch.optim.AdamW on one array, in place (float64 arithmetic)."""
    beta1, beta2 = betas
    g = g.astype(np.float64)
    decayed = p.astype(np.float64) * (1 - lr * weight_decay)
    m[...] = beta1 * m + (1 - beta1) * g
    v[...] = beta2 * v + (1 - beta2) * g * g
    denom = np.sqrt(v.astype(np.float64)) / np.sqrt(1 - beta2 ** step) + eps
    p[...] = decayed - lr / (1 - beta1 ** step) * m.astype(np.float64) / denom


def assert_trees_close(got, expected, dtype):
    assert optree.tree_structure(got) == optree.tree_structure(expected)
    for a, b in zip(optree.tree_leaves(got), optree.tree_leaves(expected)):
        assert a.dtype == np.dtype(dtype)
        np.testing.assert_allclose(a, b, **TOLERANCE[dtype])


SGD_CASES = [dict(momentum=0.0, nesterov=False, weight_decay=0.0),
             dict(momentum=0.9, nesterov=False, weight_decay=0.0),
             dict(momentum=0.9, nesterov=True, weight_decay=0.0),
             dict(momentum=0.5, nesterov=True, weight_decay=0.1),
             dict(momentum=0.0, nesterov=False, weight_decay=0.05)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", SGD_CASES,
                         ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_sgd_matches_torch_rule(dtype, case):
    rng = np.random.default_rng(1)
    params = make_tree(rng, dtype)
    expected = optree.tree_map(np.copy, params)
    buffers = [np.zeros_like(p) for p in optree.tree_leaves(params)]
    opt = optim.SGD(0.05, **case)
    state = opt.init(params)
    for step in range(1, STEPS + 1):
        grads = fresh_grads(rng, params, step)
        returned, state = opt.step(params, grads, state)
        assert returned is params
        for p, g, buf in zip(optree.tree_leaves(expected), optree.tree_leaves(grads), buffers):
            reference_sgd(p, g, buf, step, 0.05, **case)
    assert state["step"] == STEPS
    assert_trees_close(params, expected, dtype)
    if case["momentum"]:
        assert_trees_close(state["momentum_buffer"], like(params, buffers), dtype)
    else:
        assert set(state) == {"step"}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_adamw_matches_torch_rule(dtype, weight_decay):
    rng = np.random.default_rng(2)
    params = make_tree(rng, dtype)
    expected = optree.tree_map(np.copy, params)
    exp_avg = [np.zeros_like(p) for p in optree.tree_leaves(params)]
    exp_avg_sq = [np.zeros_like(p) for p in optree.tree_leaves(params)]
    hyper = dict(lr=1e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=weight_decay)
    opt = optim.AdamW(**hyper)
    state = opt.init(params)
    for step in range(1, STEPS + 1):
        grads = fresh_grads(rng, params, step)
        params, state = opt.step(params, grads, state)
        for p, g, m, v in zip(optree.tree_leaves(expected), optree.tree_leaves(grads), exp_avg,
                              exp_avg_sq):
            reference_adamw(p, g, m, v, step, **hyper)
    assert state["step"] == STEPS
    assert_trees_close(params, expected, dtype)
    assert_trees_close(state["exp_avg"], like(params, exp_avg), dtype)
    assert_trees_close(state["exp_avg_sq"], like(params, exp_avg_sq), dtype)


def test_adamw_default_hyperparameters_are_torchs():
    opt = optim.AdamW(1e-3)
    assert (opt.betas, opt.eps, opt.weight_decay) == ((0.9, 0.999), 1e-8, 0.01)


def test_learning_rate_schedule_gets_the_step():
    seen = []
    opt = optim.SGD(lambda step: seen.append(step) or 0.5 / step)
    params, grads = [np.ones(3)], [np.ones(3)]
    state = opt.init(params)
    for _ in range(3):
        params, state = opt.step(params, grads, state)
    assert seen == [1, 2, 3]
    np.testing.assert_allclose(params[0], 1 - 0.5 * (1 + 1 / 2 + 1 / 3))


def test_state_round_trips_through_a_copy():
    """A saved and restored state continues exactly like the original."""
    rng = np.random.default_rng(3)
    params = make_tree(rng, "float32")
    opt = optim.AdamW(1e-2)
    state = opt.init(params)
    params, state = opt.step(params, fresh_grads(rng, params, 1), state)
    params_copy, state_copy = optree.tree_map(np.copy, (params, state))
    grads = fresh_grads(rng, params, 2)
    opt.step(params, grads, state)
    opt.step(params_copy, grads, state_copy)
    for a, b in zip(optree.tree_leaves(params), optree.tree_leaves(params_copy)):
        np.testing.assert_array_equal(a, b)


def test_torch_tensors_are_updated_in_place():
    torch = pytest.importorskip("torch")
    params = {"w": torch.ones(4, 3), "b": torch.zeros(3)}
    grads = {"w": torch.full((4, 3), 2.0), "b": torch.ones(3)}
    opt = optim.SGD(0.1, momentum=0.9)
    state = opt.init(params)
    assert isinstance(state["momentum_buffer"]["w"], torch.Tensor)
    params, state = opt.step(params, grads, state)
    torch.testing.assert_close(params["w"], torch.full((4, 3), 0.8))
    torch.testing.assert_close(state["momentum_buffer"]["b"], torch.ones(3))


def test_torch_parameters_that_require_grad_are_updated_in_place():
    """nn.Parameter (requires_grad) cannot go through DLPack as it is; it is
    exported detached, which shares its memory."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng()
    values = rng.standard_normal((5, 3)).astype(np.float32)
    grad = rng.standard_normal((5, 3)).astype(np.float32)
    param = torch.nn.Parameter(torch.from_numpy(values.copy()))
    opt = optim.AdamW(1e-2)
    state = opt.init({"p": param})
    new_params, _ = opt.step({"p": param}, {"p": torch.from_numpy(grad)}, state)
    assert new_params["p"] is param and param.requires_grad
    expected = {"p": values.copy()}
    opt.step(expected, {"p": grad}, opt.init(expected))
    np.testing.assert_array_equal(param.detach().numpy(), expected["p"])


# The fused C step checks the options; the optimizers run it on no tensors
# when they are made, so bad options fail there, as in torch.optim.
@pytest.mark.parametrize("make, message", [
    (lambda: optim.SGD(-0.1), "sgd_step: lr must be finite and >= 0"),
    (lambda: optim.SGD(0.1, momentum=-1), "sgd_step: momentum must be finite and >= 0"),
    (lambda: optim.SGD(0.1, nesterov=True), "sgd_step: nesterov needs a momentum > 0"),
    (lambda: optim.SGD(0.1, weight_decay=-1), "sgd_step: weight_decay must be finite and >= 0"),
    (lambda: optim.AdamW(0.1, betas=(1.0, 0.9)), r"adamw_step: beta1 must be in \[0, 1\)"),
    (lambda: optim.AdamW(0.1, betas=(0.9, -0.1)), r"adamw_step: beta2 must be in \[0, 1\)"),
    (lambda: optim.AdamW(0.1, eps=-1.0), "adamw_step: eps must be finite and >= 0"),
    (lambda: optim.AdamW(0.1, weight_decay=float("inf")),
     "adamw_step: weight_decay must be finite and >= 0"),
    (lambda: optim.AdamW(float("nan")), "adamw_step: lr must be finite and >= 0"),
])
def test_bad_hyperparameters_raise_value_error(make, message):
    with pytest.raises(InvalidArgumentError, match=message):
        make()
    assert issubclass(InvalidArgumentError, ValueError)


def test_a_schedule_is_checked_at_each_step():
    params = [np.ones(3)]
    opt = optim.SGD(lambda step: 0.1 if step == 1 else -0.1)
    state = opt.init(params)
    params, state = opt.step(params, [np.ones(3)], state)
    np.testing.assert_allclose(params[0], np.full(3, 0.9))
    with pytest.raises(InvalidArgumentError, match="sgd_step: lr must be finite and >= 0"):
        opt.step(params, [np.ones(3)], state)
    np.testing.assert_allclose(params[0], np.full(3, 0.9))


def test_mismatched_grads_raise_value_error():
    params = {"w": np.ones(3), "b": np.ones(2)}
    opt = optim.SGD(0.1)
    state = opt.init(params)
    with pytest.raises(ValueError, match="grads must have the structure of params"):
        opt.step(params, {"w": np.ones(3)}, state)
    with pytest.raises(ValueError, match="shape"):
        opt.step(params, {"w": np.ones(4), "b": np.ones(2)}, state)


def test_foreign_state_raises_value_error():
    params = [np.ones(3)]
    with pytest.raises(ValueError, match="opt_state lacks 'exp_avg', 'exp_avg_sq'"):
        optim.AdamW(0.1).step(params, [np.ones(3)], optim.SGD(0.1).init(params))


def test_read_only_params_are_refused_untouched():
    params = [np.ones(3)]
    params[0].flags.writeable = False
    opt = optim.SGD(0.1)
    with pytest.raises(ValueError):
        opt.step(params, [np.ones(3)], opt.init(params))
    np.testing.assert_array_equal(params[0], np.ones(3))


# ---- clip_grad_norm ------------------------------------------------------------


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def reference_norm(leaves):
    return float(np.sqrt(sum(np.sum(np.asarray(x, np.float64) ** 2) for x in leaves)))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("max_norm", [0.5, 1e6])
def test_clip_grad_norm_matches_torch_rule(dtype, max_norm):
    rng = np.random.default_rng(4)
    grads = make_tree(rng, dtype)
    original = optree.tree_map(np.copy, grads)
    norm = optim.clip_grad_norm(grads, max_norm)
    expected = reference_norm(optree.tree_leaves(original))
    assert norm == pytest.approx(expected, rel=1e-12)
    coefficient = min(1.0, max_norm / (expected + 1e-6))
    for got, before in zip(optree.tree_leaves(grads), optree.tree_leaves(original)):
        np.testing.assert_allclose(got, before * coefficient, **TOLERANCE[dtype])
    if max_norm < expected:
        assert reference_norm(optree.tree_leaves(grads)) == pytest.approx(max_norm, rel=1e-5)


def test_clip_grad_norm_mixed_dtypes_and_empty_trees():
    grads = [np.full(10, 3.0, np.float32), np.full(6, 4.0)]
    assert optim.clip_grad_norm(grads, 100.0) == pytest.approx(np.sqrt(90 + 96))
    assert optim.clip_grad_norm({}, 1.0) == 0.0
    zeros = [np.zeros(5)]
    assert optim.clip_grad_norm(zeros, 0.0) == 0.0
    np.testing.assert_array_equal(zeros[0], np.zeros(5))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_clip_grad_norm_of_a_nan_or_infinite_norm(dtype, bad):
    """As torch.nn.utils.clip_grad_norm_ (and as on CUDA, by the same
    kernel): a NaN norm makes every gradient NaN; an infinite norm gives the
    factor 0, so finite entries become 0 and the infinite one NaN."""
    rng = np.random.default_rng()
    grads = make_tree(rng, dtype)
    leaves = optree.tree_leaves(grads)
    leaves[0].flat[rng.integers(leaves[0].size)] = bad
    before = [leaf.copy() for leaf in leaves]
    norm = optim.clip_grad_norm(grads, 1.0)
    if np.isnan(bad):
        assert np.isnan(norm)
        assert all(np.isnan(leaf).all() for leaf in leaves)
    else:
        assert norm == np.inf
        with np.errstate(invalid="ignore"):  # inf * 0
            for got, original in zip(leaves, before):
                np.testing.assert_array_equal(got, original * 0.0)
    torch = _torch()
    if torch is not None:  # torch clips the .grad of parameters
        params = [torch.zeros(original.shape, dtype=getattr(torch, dtype)) for original in before]
        for param, original in zip(params, before):
            param.grad = torch.from_numpy(original.copy())
        torch_norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        np.testing.assert_array_equal(norm, torch_norm.numpy())
        for got, param in zip(leaves, params):
            np.testing.assert_array_equal(got, param.grad.numpy())


def test_clip_grad_norm_writes_in_place_even_when_not_clipping():
    """The factor is computed by the kernel that applies it, so gradients
    must be writable even when their norm is below max_norm."""
    grads = [np.ones(3)]
    grads[0].flags.writeable = False
    with pytest.raises(InvalidArgumentError, match="read-only"):
        optim.clip_grad_norm(grads, 1e6)
    np.testing.assert_array_equal(grads[0], np.ones(3))


def test_clip_grad_norm_rejects_negative_max_norm():
    with pytest.raises(ValueError, match="max_norm must be >= 0"):
        optim.clip_grad_norm([np.ones(2)], -1.0)
