"""The names of the JAX libraries concord replaces (datarax, xlstm-jax,
artifex) where concord names a function its own way: this table is the one
place they are defined.

Each entry maps such a name to concord's own name in the same place. The
module that owns the names binds its part when it is imported, after its
own definitions, so the old names import like any other:

    concord.data_parallel               FUNCTIONS    shard_batch -> place_batch_on_shards
    concord.data_parallel.DataParallel  METHODS      all_reduce_gradients -> reduce_gradients
                                        STATIC       shard_batch_static -> place_batch_on_shards,
                                                     the module function a method wraps
    concord.metrics                     COLLECTIVES  reduce_mean_collective -> reduce_mean,
                                                     with datarax's axis_name="batch"

Nothing of concord is imported here: the modules named above import this
one, never the reverse.
"""

__all__ = ["COLLECTIVES", "FUNCTIONS", "METHODS", "STATIC", "bind_collectives",
           "bind_functions", "bind_methods"]

# concord.data_parallel: other names of its functions.
FUNCTIONS = {
    "shard_batch": "place_batch_on_shards",
    "shard_model_state": "place_model_state_on_shards",
    "all_reduce_gradients": "reduce_gradients_across_devices",
    "reduce_gradient_tree": "reduce_gradients_across_devices",
}

# DataParallel: other names of its methods.
METHODS = {
    "create_data_parallel_sharding": "create_sharding",
    "all_reduce_gradients": "reduce_gradients",
}

# DataParallel: each method's static twin, the module-level function of
# concord.data_parallel that takes the mesh (or sharding) explicitly.
STATIC = {
    "create_mesh_static": "_create_mesh",
    "create_sharding_static": "create_data_parallel_sharding",
    "create_data_parallel_sharding_static": "create_data_parallel_sharding",
    "shard_batch_static": "place_batch_on_shards",
    "shard_model_state_static": "place_model_state_on_shards",
    "replicate_params_static": "replicate_params",
    "shard_params_static": "shard_params",
    "gather_params_static": "gather_params",
    "sync_gradients_static": "sync_gradients",
    "reduce_gradients_static": "reduce_gradients_across_devices",
    "all_reduce_gradients_static": "reduce_gradients_across_devices",
}

# concord.metrics: datarax's collective reductions, whose axis_name is
# positional and defaults to "batch" (see concord.mesh.BATCH_AXIS).
COLLECTIVES = {
    "reduce_mean_collective": "reduce_mean",
    "reduce_sum_collective": "reduce_sum",
}


def bind_functions(namespace):
    """Adds FUNCTIONS to a module's globals()."""
    namespace.update({alias: namespace[name] for alias, name in FUNCTIONS.items()})


def bind_methods(cls, functions):
    """Adds METHODS, and STATIC (from the module globals() `functions`), to `cls`."""
    for alias, name in METHODS.items():
        setattr(cls, alias, getattr(cls, name))
    for alias, name in STATIC.items():
        setattr(cls, alias, staticmethod(functions[name]))


def _collective(reduce, name, module, default_axis):
    def collective(metrics, axis_name=default_axis):
        return reduce(metrics, axis_name=axis_name)

    collective.__name__ = collective.__qualname__ = name
    collective.__module__ = module
    collective.__doc__ = (f"{reduce.__name__} over `axis_name`; datarax's default \"batch\" is "
                          "that axis of the active mesh, the whole mesh when it has none, and "
                          "the whole world when no mesh is active.")
    return collective


def bind_collectives(namespace, default_axis):
    """Adds COLLECTIVES to a module's globals(), their axis_name defaulting
    to `default_axis` (concord.mesh.BATCH_AXIS, which the importing module
    passes: nothing of concord is imported here)."""
    for alias, name in COLLECTIVES.items():
        namespace[alias] = _collective(namespace[name], alias, namespace["__name__"],
                                       default_axis)
