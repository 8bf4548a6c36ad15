"""Meshes, partition specs and named shardings.

Multi-rank checks run in one concord.launch job per world size (starting
ranks is the cost); each rank returns what it saw and the parent compares it
with what the row-major layout says.
"""

import pickle
import threading

import numpy as np
import pytest

import concord as cc
from concord.data_parallel import DataParallel
from concord.mesh import BATCH_AXIS, axis_comm


# ---- one process ---------------------------------------------------------------

@pytest.mark.parametrize("shape, names, message", [
    ((0,), ("data",), r"mesh shape \(0,\) has a size below 1"),
    ((-1, -1), ("a", "b"), r"has a size below 1"),
    ((2,), ("data",), r"mesh shape \(2,\) holds 2 ranks but the communicator has 1"),
    ((1, 1), ("data",), r"has 2 axes but 1 axis names"),
    ((1, 1), ("data", "data"), r"repeat a name"),
    ((1.5,), ("data",), r"must be integers"),
    ((1,), (3,), r"axis name must be a string"),
])
def test_make_mesh_rejects_bad_shapes(world1, shape, names, message):
    with pytest.raises(ValueError, match=message):
        cc.make_mesh(shape, names)


def test_mesh_of_one(world1):
    mesh = cc.make_mesh((1, 1), ("data", "model"))
    assert mesh.axis_names == ("data", "model")
    assert mesh.shape == {"data": 1, "model": 1}
    assert mesh.size == 1 and mesh.rank == 0
    assert mesh.coords == {"data": 0, "model": 0}
    assert mesh.axis_size(("data", "model")) == 1
    assert mesh.axis_index("model") == 0
    assert mesh.comm() is world1
    assert mesh.comm("data").size == 1
    assert mesh.comm(("data", "model")) is mesh.comm(("data", "model"))
    with pytest.raises(ValueError, match=r"unknown axis 'x'; mesh axes are \('data', 'model'\)"):
        mesh.comm("x")
    with pytest.raises(ValueError, match="repeat an axis"):
        mesh.comm(("data", "data"))
    with pytest.raises(ValueError, match="at least one axis name"):
        mesh.comm(())
    mesh.close()


def test_make_mesh_accepts_a_single_size_and_name(world1):
    mesh = cc.make_mesh(1, "data")
    assert mesh.shape == {"data": 1}
    assert mesh.comm("data") is world1


def test_use_mesh_nests_and_restores(world1):
    outer = cc.make_mesh((1,), ("data",))
    inner = cc.make_mesh((1, 1), ("data", "fsdp"))
    assert cc.current_mesh() is None
    with cc.use_mesh(outer) as active:
        assert active is outer and cc.current_mesh() is outer
        with cc.use_mesh(inner):
            assert cc.current_mesh() is inner
        assert cc.current_mesh() is outer
    assert cc.current_mesh() is None
    with pytest.raises(TypeError):
        with cc.use_mesh("data"):
            pass


def test_use_mesh_is_per_thread(world1):
    mesh = cc.make_mesh((1,), ("data",))
    seen = []
    with cc.use_mesh(mesh):
        thread = threading.Thread(target=lambda: seen.append(cc.current_mesh()))
        thread.start()
        thread.join()
    assert seen == [None]


def test_axis_comm_resolution(world1):
    # With no mesh every name is the world (the seeds' "batch" default).
    assert axis_comm(None) is world1
    assert axis_comm("batch") is world1
    assert axis_comm(("data", "fsdp")) is world1
    with pytest.raises(ValueError, match="axis name must be a string"):
        axis_comm(3)
    mesh = cc.make_mesh((1, 1), ("data", "fsdp"))
    assert axis_comm("data", mesh) is mesh.comm("data")
    with cc.use_mesh(mesh):
        assert axis_comm(None) is world1
        assert axis_comm("fsdp") is mesh.comm("fsdp")
        with pytest.raises(ValueError, match=r"unknown axis 'batch'; mesh axes are "
                                             r"\('data', 'fsdp'\)"):
            axis_comm("batch")
        # A function's default "batch", which its caller left: the whole mesh.
        assert BATCH_AXIS == "batch"
        assert axis_comm(BATCH_AXIS) is mesh.comm()
    assert axis_comm(BATCH_AXIS) is world1


def test_partition_spec():
    spec = cc.PartitionSpec("data", None, ("fsdp", "model"), ["x"], ())
    assert tuple(spec) == ("data", None, ("fsdp", "model"), ("x",), None)
    assert repr(cc.PartitionSpec("data", None)) == "PartitionSpec('data', None)"
    assert cc.PartitionSpec() == ()
    with pytest.raises(ValueError, match="axis name must be a string"):
        cc.PartitionSpec(3)
    assert pickle.loads(pickle.dumps(spec)) == spec


def test_named_sharding_on_one_rank(world1):
    mesh = cc.make_mesh((1, 1), ("data", "model"))
    sharding = cc.NamedSharding(mesh, cc.PartitionSpec("data", "model"))
    assert sharding.shard_shape((6, 4, 5)) == (6, 4, 5)
    assert sharding.local_slices((6, 4)) == (slice(0, 6), slice(0, 4))
    with pytest.raises(ValueError, match="has 2 entries but the array has shape"):
        sharding.shard_shape((6,))
    with pytest.raises(ValueError, match="unknown axis 'x'"):
        cc.NamedSharding(mesh, cc.PartitionSpec("x"))
    with pytest.raises(ValueError, match="repeat an axis"):
        cc.NamedSharding(mesh, cc.PartitionSpec("data", "data"))
    assert cc.NamedSharding(mesh, ("data",)).spec == cc.PartitionSpec("data")


def test_device_mesh_manager_on_one_rank(world1):
    manager = cc.DeviceMeshManager()
    assert manager.num_devices == 1
    assert manager.get_mesh_info() == {"total_devices": 1, "axes": {}}
    mesh = manager.create_device_mesh([("data", 1), ("model", 1)])
    assert manager.get_mesh_info() == {"total_devices": 1, "axes": {"data": 1, "model": 1}}
    assert manager.create_model_parallel_mesh().axis_names == ("model",)
    assert manager.get_mesh_info(mesh)["axes"] == {"data": 1, "model": 1}
    with pytest.raises(ValueError, match="holds 2 ranks but the communicator has 1"):
        manager.create_data_parallel_mesh(2)


@pytest.mark.parametrize("make", [
    lambda devices: cc.make_mesh((2,), ("data", "model"), devices=devices),
    lambda devices: cc.DeviceMeshManager.create_device_mesh({"data": 2}, devices),
    lambda devices: cc.DeviceMeshManager().create_device_mesh([("data", 1), ("model", 2)],
                                                              devices=devices),
    lambda devices: DataParallel().create_mesh({"data": 2}, devices=devices),
    lambda devices: DataParallel.create_mesh_static({"data": 2}, devices=devices),
], ids=["make_mesh", "manager class", "manager", "DataParallel", "static"])
@pytest.mark.parametrize("devices", [[0], [0, 1, 2], [], ["cpu:0"]])
def test_a_device_count_unlike_the_mesh_is_refused_first(make, devices):
    # No world is initialised (looking it up would raise ConcordError), and
    # make_mesh's axis names do not match its shape: the count is checked
    # before either.
    with pytest.raises(cc.InvalidArgumentError,
                       match=rf"devices holds {len(devices)} ranks but mesh shape \(.*\) holds 2$"):
        make(devices)


def test_devices_must_be_every_rank_once(world1):
    for devices, message in [
            (["cpu:0"], r"devices must be ranks of the communicator \(integers\), got \['cpu:0'\]"),
            (3, "devices must be a sequence of ranks, got int"),
            ([1], r"devices must list every rank of the communicator \(0 to 0\) once, got \[1\]"),
            ([-1], r"every rank of the communicator \(0 to 0\) once, got \[-1\]")]:
        with pytest.raises(cc.InvalidArgumentError, match=message):
            cc.make_mesh((1,), ("data",), devices=devices)
    mesh = cc.make_mesh((1, 1), ("data", "model"), devices=np.array([0]))
    assert mesh.comm() is world1 and mesh.coords == {"data": 0, "model": 0}
    mesh.close()
    assert not world1.closed


# ---- several ranks -------------------------------------------------------------

def _members(comm):
    """World ranks of a communicator's members, in its rank order."""
    return cc.all_gather(np.array([cc.rank()], np.int64), comm=comm).tolist()


def _mesh_job(shape, names, tuples):
    """What one rank sees of a mesh: coordinates, each axis group and
    each tuple group (world ranks in communicator order), axis indices."""
    cc.init(timeout=60.0)
    mesh = cc.make_mesh(shape, names)
    seen = {
        "coords": mesh.coords,
        "axes": {name: _members(mesh.comm(name)) for name in names},
        "tuples": {group: _members(mesh.comm(group)) for group in tuples},
        "index": {group: mesh.axis_index(group) for group in tuples},
        "rank in": {name: mesh.comm(name).rank for name in names},
    }
    mesh.close()
    return seen


def _expected_groups(shape, names, group, rank):
    """World ranks differing from `rank` only along `group`, ordered
    row-major over `group` in the order given."""
    coords = np.unravel_index(rank, shape)
    axes = [names.index(name) for name in group]
    members = []
    for index in np.ndindex(*[shape[axis] for axis in axes]):
        point = list(coords)
        for axis, value in zip(axes, index):
            point[axis] = value
        members.append(int(np.ravel_multi_index(point, shape)))
    return members


@pytest.mark.parametrize("shape, names, tuples", [
    ((2,), ("data",), [("data",)]),
    ((3,), ("data",), []),
    ((1, 2), ("data", "model"), [("model", "data")]),
    ((2, 2), ("data", "fsdp"), [("data", "fsdp"), ("fsdp", "data")]),
    ((2, 1, 2), ("data", "pipe", "model"), [("data", "model"), ("model", "pipe"),
                                             ("data", "pipe", "model")]),
])
def test_mesh_layout_is_row_major(shape, names, tuples):
    size = int(np.prod(shape))
    results = cc.launch(_mesh_job, size, shape, names, tuples)
    for rank, seen in enumerate(results):
        coords = np.unravel_index(rank, shape)
        assert seen["coords"] == {name: int(c) for name, c in zip(names, coords)}
        for name in names:
            expected = _expected_groups(shape, names, (name,), rank)
            assert seen["axes"][name] == expected
            assert seen["rank in"][name] == seen["coords"][name]
        for group in tuples:
            members = _expected_groups(shape, names, group, rank)
            assert seen["tuples"][group] == members
            assert seen["index"][group] == members.index(rank)


def _sharding_job():
    cc.init(timeout=60.0)
    mesh = cc.make_mesh((2, 2), ("data", "fsdp"))
    results = {}
    for spec in [("data",), (None, "fsdp"), ("fsdp", "data"), (("data", "fsdp"),),
                 (("fsdp", "data"), None), ()]:
        sharding = cc.NamedSharding(mesh, cc.PartitionSpec(*spec))
        results[spec] = (sharding.shard_shape((8, 4, 3)), sharding.local_slices((8, 4, 3)))
    try:
        cc.NamedSharding(mesh, cc.PartitionSpec(("data", "fsdp"))).shard_shape((6, 4))
    except ValueError as exc:
        results["error"] = str(exc)
    with cc.use_mesh(mesh):
        try:
            axis_comm("model")
        except ValueError as exc:
            results["unknown"] = str(exc)
    manager = cc.DeviceMeshManager()
    hybrid = manager.create_hybrid_mesh(2, 2)
    results["hybrid"] = (hybrid.coords, manager.get_mesh_info())
    try:
        manager.create_hybrid_mesh(2, 3)
    except ValueError as exc:
        results["hybrid error"] = str(exc)
    results["dp"] = manager.create_data_parallel_mesh().shape
    return results


def test_named_sharding_and_manager_on_four_ranks():
    results = cc.launch(_sharding_job, 4)
    global_data = np.arange(8 * 4 * 3).reshape(8, 4, 3)
    for rank, seen in enumerate(results):
        d, f = divmod(rank, 2)
        blocks = {
            ("data",): (slice(4 * d, 4 * d + 4), slice(None)),
            (None, "fsdp"): (slice(None), slice(2 * f, 2 * f + 2)),
            ("fsdp", "data"): (slice(4 * f, 4 * f + 4), slice(2 * d, 2 * d + 2)),
            (("data", "fsdp"),): (slice(2 * rank, 2 * rank + 2),),
            (("fsdp", "data"), None): (slice(2 * (2 * f + d), 2 * (2 * f + d) + 2),),
            (): (),
        }
        for spec, where in blocks.items():
            shape, slices = seen[spec]
            expected = global_data[where]
            assert shape == expected.shape, spec
            assert np.array_equal(global_data[slices], expected), spec
        assert "dimension 0 of shape (6, 4) has size 6, not divisible by 4" in seen["error"]
        assert seen["unknown"] == "unknown axis 'model'; mesh axes are ('data', 'fsdp')"
        assert seen["hybrid"] == ({"data": d, "model": f},
                                  {"total_devices": 4, "axes": {"data": 2, "model": 2}})
        assert "holds 6 ranks but the communicator has 4" in seen["hybrid error"]
        assert seen["dp"] == {"data": 4}


def _devices_job(order):
    """What one rank sees of meshes laid over `order` (world ranks): its
    mesh rank and coordinates, the world ranks of each group in
    communicator order; then what lists unlike the mesh, or unlike the
    peers', raise."""
    cc.init(timeout=60.0)
    shape = {"data": 2, "model": 2}
    meshes = {
        "make_mesh": cc.make_mesh(tuple(shape.values()), tuple(shape), devices=order),
        "manager": cc.DeviceMeshManager.create_device_mesh(shape, order),
        "DataParallel": DataParallel().create_mesh(shape, devices=order),
        "DataParallel 1-D": DataParallel().create_mesh(devices=order),
    }
    seen = {}
    for how, mesh in meshes.items():
        seen[how] = {"rank": mesh.rank, "coords": mesh.coords,
                     "groups": {name: _members(mesh.comm(name))
                                for name in (None, *mesh.axis_names)}}
        mesh.close()
        seen[how]["closed"] = mesh.comm().closed
    in_order = cc.make_mesh((2, 2), ("data", "model"), devices=range(4))
    seen["in order is the world"] = in_order.comm() is cc.world()
    for how, devices in [("short", order[:3]),
                         ("unlike the peers'", order[::-1] if cc.rank() == 0 else order)]:
        try:
            cc.make_mesh((2, 2), ("data", "model"), devices=devices)
        except cc.ConcordError as exc:
            seen[how] = f"{type(exc).__name__}: {exc}"
    # Nothing is left half done: the ranks are still in step.
    seen["after"] = cc.all_reduce(np.ones(1)).tolist()
    return seen


def test_meshes_laid_over_devices_in_their_order(seed):
    order = np.random.default_rng(seed).permutation(4).tolist()
    if order == sorted(order):
        order.reverse()
    shape, names = (2, 2), ("data", "model")
    for rank, seen in enumerate(cc.launch(_devices_job, 4, order)):
        position = order.index(rank)
        coords = dict(zip(names, map(int, np.unravel_index(position, shape))))
        groups = {None: order, **{name: [order[p] for p in _expected_groups(shape, names,
                                                                             (name,), position)]
                                  for name in names}}
        for how in ("make_mesh", "manager", "DataParallel"):
            assert seen[how] == {"rank": position, "coords": coords, "groups": groups,
                                 "closed": True}, how
        assert seen["DataParallel 1-D"] == {"rank": position, "coords": {"data": position},
                                            "groups": {None: order, "data": order},
                                            "closed": True}
        assert seen["in order is the world"]
        assert seen["short"] == ("InvalidArgumentError: devices holds 3 ranks but mesh shape "
                                 "(2, 2) holds 4")
        assert seen["unlike the peers'"].startswith(
            "MismatchError: make_mesh: ranks passed different devices; each group agrees "
            "within itself: ranks [0]; ranks [1, 2, 3]")
        assert seen["after"] == [4.0]
