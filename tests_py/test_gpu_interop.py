"""CUDA arrays of torch and CuPy in and out of concord, through DLPack.

Results come back as the caller's array type on the caller's device: a
torch CUDA tensor in, a torch CUDA tensor out; a CuPy array in, a CuPy
array out; in place and into out= as well. Calls are ordered on the
caller's current stream (torch.cuda.current_stream(), CuPy's current
stream). CuPy tests skip when cupy is not installed.
"""

import numpy as np
import pytest

import concord as cc
from concord import metrics as M
from concord import optim

pytestmark = pytest.mark.gpu


# ---- torch -----------------------------------------------------------------------


def test_torch_in_torch_out(torch_cuda, world1, rng, seed):
    torch = torch_cuda
    data = rng.standard_normal((4, 6)).astype(np.float32)
    x = torch.from_numpy(data).cuda()
    for name, result in [("all_reduce", cc.all_reduce(x, "max")),
                         ("all_gather", cc.all_gather(x, axis=1)),
                         ("all_gather stacked", cc.all_gather(x, tiled=False)),
                         ("reduce_scatter", cc.reduce_scatter(x, "sum", axis=1)),
                         ("broadcast", cc.broadcast(x)),
                         ("async all_reduce", cc.all_reduce(x, "mean", async_op=True).wait())]:
        assert type(result) is torch.Tensor, f"{name}: {type(result).__name__}"
        assert result.device == x.device, f"{name}: on {result.device}"
        assert result.dtype == torch.float32, f"{name}: {result.dtype}"
        expected = data[None] if name == "all_gather stacked" else data
        np.testing.assert_array_equal(result.cpu().numpy(), expected, err_msg=f"seed {seed}: {name}")


def test_torch_in_place_and_out(torch_cuda, world1, rng, seed):
    torch = torch_cuda
    data = rng.integers(-100, 100, 1001).astype(np.int64)
    x = torch.from_numpy(data).cuda()
    assert cc.all_reduce(x, "sum", out=x) is x
    out = torch.empty_like(x)
    assert cc.all_reduce(x, "min", out=out) is out
    assert cc.broadcast(out, 0, out=out) is out
    gathered = torch.empty(1001, dtype=torch.int64, device="cuda")
    assert cc.all_gather(x, out=gathered) is gathered
    for tensor in (x, out, gathered):
        np.testing.assert_array_equal(tensor.cpu().numpy(), data, err_msg=f"seed {seed}")


def test_torch_bfloat16_round_trip(torch_cuda, world1, rng, seed):
    """bfloat16 has no NumPy dtype: it travels by DLPack and comes back
    bit for bit on a world of one."""
    torch = torch_cuda
    x = torch.from_numpy(rng.standard_normal(10007).astype(np.float32)).to(
        torch.bfloat16).cuda()
    for name, result in [("all_reduce", cc.all_reduce(x)),
                         ("all_reduce mean", cc.all_reduce(x, "mean")),
                         ("all_gather", cc.all_gather(x)),
                         ("reduce_scatter", cc.reduce_scatter(x)),
                         ("broadcast", cc.broadcast(x))]:
        assert type(result) is torch.Tensor and result.dtype == torch.bfloat16, name
        assert result.device == x.device, name
        assert torch.equal(result, x), f"seed {seed}: {name}"
    y = x.clone()
    assert cc.all_reduce(y, "max", out=y) is y and torch.equal(y, x)


def test_torch_non_default_stream(torch_cuda, world1, rng, seed):
    torch = torch_cuda
    data = rng.standard_normal(1 << 20).astype(np.float32)
    source = torch.from_numpy(data).cuda()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        x = source * 2  # produced on the stream
        result = cc.all_reduce(x, "sum")
        cc.all_reduce(x, "max", out=x)
        after = result + x  # consumed on the stream
    stream.synchronize()
    np.testing.assert_allclose(after.cpu().numpy(), 4 * data, rtol=1e-6, err_msg=f"seed {seed}")


def test_torch_mixed_with_other_array_types_is_refused(torch_cuda, world1):
    torch = torch_cuda
    x = torch.ones(4, device="cuda")
    with pytest.raises(cc.InvalidArgumentError):
        cc.all_reduce(x, out=np.zeros(4, np.float32))
    with pytest.raises(cc.InvalidArgumentError):
        cc.all_reduce(np.ones(4, np.float32), out=x)


def test_functional_metric_reductions_keep_the_leaf_type(torch_cuda, world1):
    torch = torch_cuda
    tree = {"loss": torch.tensor(1.5, device="cuda"),
            "vec": torch.arange(5, dtype=torch.float32, device="cuda"),
            "ints": torch.arange(4, dtype=torch.int64, device="cuda")}
    for reduce in (M.reduce_mean, M.reduce_sum, M.reduce_max, M.reduce_min):
        result = reduce(tree)
        for key, leaf in tree.items():
            got = result[key]
            assert type(got) is torch.Tensor, f"{reduce.__name__} {key}: {type(got).__name__}"
            assert got.device == leaf.device, f"{reduce.__name__} {key}: on {got.device}"
            assert torch.equal(got, leaf), f"{reduce.__name__} {key}"
    gathered = M.all_gather({"vec": tree["vec"]})["vec"]
    assert type(gathered) is torch.Tensor and gathered.device == tree["vec"].device
    assert torch.equal(gathered, tree["vec"][None])


# ---- CuPy -------------------------------------------------------------------------


def test_cupy_in_cupy_out(cupy_cuda, world1, rng, seed):
    cp = cupy_cuda
    data = rng.standard_normal((6, 4))
    x = cp.asarray(data)
    for name, result in [("all_reduce", cc.all_reduce(x, "sum")),
                         ("all_gather", cc.all_gather(x, axis=1)),
                         ("reduce_scatter", cc.reduce_scatter(x, "max")),
                         ("broadcast", cc.broadcast(x)),
                         ("async all_reduce", cc.all_reduce(x, "min", async_op=True).wait())]:
        assert type(result) is cp.ndarray, f"{name}: {type(result).__name__}"
        assert result.device == x.device, f"{name}: on {result.device}"
        np.testing.assert_array_equal(cp.asnumpy(result), data, err_msg=f"seed {seed}: {name}")


def test_cupy_in_place_and_out(cupy_cuda, world1, rng, seed):
    cp = cupy_cuda
    data = rng.integers(0, 2, 999).astype(bool)
    x = cp.asarray(data)
    assert cc.all_reduce(x, "max", out=x) is x
    out = cp.empty_like(x)
    assert cc.all_reduce(x, "min", out=out) is out
    for array in (x, out):
        np.testing.assert_array_equal(cp.asnumpy(array), data, err_msg=f"seed {seed}")
    halves = cp.asarray(rng.standard_normal(101).astype(np.float16))
    assert cc.broadcast(halves, out=halves) is halves


def test_cupy_non_default_stream(cupy_cuda, world1, rng, seed):
    cp = cupy_cuda
    data = rng.standard_normal(1 << 20).astype(np.float32)
    source = cp.asarray(data)
    cp.cuda.get_current_stream().synchronize()
    with cp.cuda.Stream(non_blocking=True) as stream:
        x = source * 2  # produced on the stream
        result = cc.all_reduce(x, "sum")
        cc.all_reduce(x, "max", out=x)
        after = result + x  # consumed on the stream
    stream.synchronize()
    np.testing.assert_allclose(cp.asnumpy(after), 4 * data, rtol=1e-6, err_msg=f"seed {seed}")


def test_cupy_kernels(cupy_cuda, rng, seed):
    """An optimizer step and a metric update on CuPy arrays, against NumPy."""
    cp = cupy_cuda
    params = [rng.standard_normal(s).astype(np.float32) for s in (1001, 7, 33)]
    grads = [rng.standard_normal(p.shape).astype(np.float32) for p in params]
    params_gpu = [cp.asarray(p) for p in params]
    opt, opt_gpu = optim.AdamW(1e-2), optim.AdamW(1e-2)
    state, state_gpu = opt.init(params), opt_gpu.init(params_gpu)
    opt.step(params, grads, state)
    opt_gpu.step(params_gpu, [cp.asarray(g) for g in grads], state_gpu)
    assert all(type(b) is cp.ndarray for b in state_gpu["exp_avg"])
    for got, expected in zip(params_gpu, params):
        np.testing.assert_allclose(cp.asnumpy(got), expected, rtol=1e-6, atol=1e-6,
                                   err_msg=f"seed {seed}")

    scores = rng.standard_normal((999, 7)).astype(np.float32)
    target = rng.integers(0, 7, 999)
    cpu, gpu = M.ConfusionMatrix(7), M.ConfusionMatrix(7)
    cpu.update(scores, target)
    gpu.update(cp.asarray(scores), cp.asarray(target))
    got = gpu.compute()
    np.testing.assert_array_equal(cp.asnumpy(got) if isinstance(got, cp.ndarray) else got,
                                  cpu.compute(), err_msg=f"seed {seed}")


def test_torch_and_cupy_do_not_mix(torch_cuda, cupy_cuda, world1):
    torch, cp = torch_cuda, cupy_cuda
    with pytest.raises(cc.InvalidArgumentError):
        cc.all_reduce(torch.ones(4, device="cuda"), out=cp.zeros(4, cp.float32))
