"""ShardedArray as a node of JAX's pytrees: jax.tree functions map over its
local block and keep its sharding, jax.jit and jax.grad take and return
it, and the registration happens whichever of concord and JAX is imported
first, without concord importing JAX. optree's default registry, which
concord's own functions use, still sees a ShardedArray whole.
"""

import subprocess
import sys
import types

import numpy as np
import optree
import pytest

from concord import data_parallel as dp
from concord.errors import InvalidArgumentError
from concord.sharded import ShardedArray, flatten

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

pytestmark = pytest.mark.jax

# (local block shape, global shape, split dimension, axis name): odd sizes,
# one axis or a tuple of them.
SHARDINGS = [((3, 5), (9, 5), 0, "fsdp"), ((7,), (14,), 0, ("data", "fsdp")),
             ((2, 1, 3), (2, 5, 3), 1, "model")]
DTYPES = ["float32", "int32", "float16"]


def block(rng, shape, dtype):
    if np.dtype(dtype).kind == "i":
        return rng.integers(-1000, 1000, shape).astype(dtype)
    return rng.uniform(-3.0, 3.0, shape).astype(dtype)


def sharded(rng, sharding, dtype):
    shape, global_shape, dim, axis_name = sharding
    return ShardedArray(block(rng, shape, dtype), global_shape, dim, axis_name)


def assert_same_sharding(got, like):
    assert isinstance(got, ShardedArray)
    assert (got.global_shape, got.dim, got.axis_name) == (like.global_shape, like.dim,
                                                          like.axis_name)


# ---- registration, without concord importing JAX --------------------------------------

_REGISTERED = """
import importlib.util, sys
import numpy as np
{imports}
from concord.sharded import ShardedArray
local = np.arange(6.0).reshape(2, 3)
leaves = jax.tree_util.tree_leaves({{"w": ShardedArray(local, (4, 3), 0, "fsdp")}})
assert len(leaves) == 1 and leaves[0] is local, leaves
"""

_CONCORD_FIRST = """
import concord, concord.sharded
assert "jax" not in sys.modules, "importing concord imported jax"
assert importlib.util.find_spec("jax") is not None  # asked for, not imported:
assert "jax" not in sys.modules, "finding jax's spec imported it"
import jax
"""


@pytest.mark.parametrize("imports", [_CONCORD_FIRST, "import jax\nimport concord"],
                         ids=["concord first", "jax first"])
def test_sharded_array_is_a_jax_node_whichever_is_imported_first(imports):
    code = _REGISTERED.format(imports=imports)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_optree_and_concord_still_see_a_sharded_array_whole(rng):
    array = sharded(rng, SHARDINGS[0], "float32")
    tree = {"b": np.ones(2), "w": array}
    assert optree.tree_leaves(tree)[1] is array
    assert flatten(tree)[0][1] is array
    assert optree.tree_leaves(tree, namespace="concord")[1] is array.local


# ---- jax.tree functions ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sharding", SHARDINGS)
def test_tree_map_maps_the_local_block_and_keeps_the_sharding(rng, sharding, dtype):
    array = sharded(rng, sharding, dtype)
    bias = block(rng, (4,), dtype)
    doubled = jax.tree.map(lambda x: x * 2, {"w": array, "b": bias})
    assert_same_sharding(doubled["w"], array)
    expected = array.local * np.asarray(2, dtype)
    assert doubled["w"].local.dtype == expected.dtype
    assert np.array_equal(doubled["w"].local, expected)
    assert np.array_equal(doubled["b"], bias * np.asarray(2, dtype))
    # Two trees of ShardedArrays map leaf by leaf.
    other = array.replace(block(rng, sharding[0], dtype))
    summed = jax.tree.map(lambda x, y: x + y, array, other)
    assert_same_sharding(summed, array)
    assert np.array_equal(summed.local, array.local + other.local)


def test_tree_leaves_are_the_local_blocks_with_their_key_paths(rng):
    arrays = [sharded(rng, sharding, "float32") for sharding in SHARDINGS]
    tree = {"layers": arrays, "scale": 1.5}
    leaves = jax.tree.leaves(tree)
    assert len(leaves) == len(arrays) + 1
    assert all(leaf is array.local for leaf, array in zip(leaves, arrays))
    paths = [jax.tree_util.keystr(path)
             for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    assert paths == ["['layers'][0].local", "['layers'][1].local", "['layers'][2].local",
                     "['scale']"]


@pytest.mark.parametrize("sharding", SHARDINGS)
def test_flatten_and_unflatten_round_trip(rng, sharding):
    array = sharded(rng, sharding, "float32")
    leaves, treedef = jax.tree.flatten(array)
    assert len(leaves) == 1 and leaves[0] is array.local
    rebuilt = jax.tree.unflatten(treedef, leaves)
    assert_same_sharding(rebuilt, array)
    assert rebuilt.local is array.local
    # The sharding is the node's static data: equal shardings give equal
    # structures, any difference another one.
    assert jax.tree.structure(array.replace(array.local * 2)) == treedef
    shape, global_shape, dim, axis_name = sharding
    for changed in [ShardedArray(array.local, global_shape, dim, "other"),
                    ShardedArray(array.local, (global_shape[0] * 2, *global_shape[1:]), dim,
                                 axis_name)]:
        assert jax.tree.structure(changed) != treedef


# ---- jax.jit and jax.grad -------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_jit_takes_and_returns_sharded_arrays(rng, dtype):
    traces = []

    @jax.jit
    def scale(array, factor):
        traces.append(array.axis_name)
        return jax.tree.map(lambda x: x * factor, array)

    for sharding in SHARDINGS:
        array = sharded(rng, sharding, dtype)
        factor = np.asarray(3, dtype)
        result = scale(array, factor)
        assert_same_sharding(result, array)
        assert isinstance(result.local, jax.Array)
        np.testing.assert_array_equal(np.asarray(result.local), array.local * factor)
        passed = jax.jit(lambda a: a)(array)
        assert_same_sharding(passed, array)
        np.testing.assert_array_equal(np.asarray(passed.local), array.local)
    # The sharding is static: new values trace nothing again, another axis
    # name does.
    again = sharded(rng, SHARDINGS[0], dtype)
    scale(again, np.asarray(2, dtype))
    renamed = ShardedArray(again.local, again.global_shape, again.dim, "other")
    np.testing.assert_array_equal(np.asarray(scale(renamed, np.asarray(2, dtype)).local),
                                  again.local * np.asarray(2, dtype))
    assert traces == [sharding[3] for sharding in SHARDINGS] + ["other"]
    # Several axes given as a list are kept as a tuple, which jit can hash.
    listed = ShardedArray(again.local, again.global_shape, again.dim, ["data", "model"])
    assert listed.axis_name == ("data", "model")
    np.testing.assert_array_equal(np.asarray(scale(listed, np.asarray(2, dtype)).local),
                                  again.local * np.asarray(2, dtype))


def test_grad_with_respect_to_a_sharded_array_is_a_sharded_array(rng):
    array = sharded(rng, SHARDINGS[0], "float32")
    weights = block(rng, SHARDINGS[0][0], "float32")
    grad = jax.jit(jax.grad(lambda a: jnp.sum(a.local ** 2 * weights)))(array)
    assert_same_sharding(grad, array)
    np.testing.assert_allclose(np.asarray(grad.local), 2 * array.local * weights, rtol=1e-6)


# ---- what stays refused ---------------------------------------------------------------

def test_steps_that_average_every_gradient_refuse_sharded_params_before_communicating(rng):
    # No world is initialised: any communication would raise ConcordError.
    params = {"w": sharded(rng, SHARDINGS[0], "float32"), "b": jnp.zeros(3)}
    state = types.SimpleNamespace(step=0, params=params, opt_state=())
    mixing = "is a ShardedArray; these steps average every gradient over the ranks"
    with pytest.raises(InvalidArgumentError, match=f"spmd_train_step: leaf w {mixing}"):
        dp.spmd_train_step(params, None, None, None, ())
    with pytest.raises(InvalidArgumentError, match=f"data_parallel_train_step: leaf w {mixing}"):
        dp.data_parallel_train_step(None, None, None, state)
    with pytest.raises(InvalidArgumentError, match="replicate_params: leaf w is a ShardedArray; "
                                                   "each rank's block differs"):
        dp.replicate_params(params)
