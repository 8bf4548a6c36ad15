"""Whether pytree leaves are JAX tracers (inside jax.jit, grad, scan, ...):
they have no values yet, so the pytree functions hand them to concord.jax,
whose collectives run inside the compiled computation. JAX is not imported
here: while it is not imported, nothing is a tracer."""

import sys

__all__ = ["traced"]


def traced(leaves):
    """True when any of `leaves` is a JAX tracer."""
    jax = sys.modules.get("jax")
    if jax is None:
        return False
    tracer = jax.core.Tracer
    return any(isinstance(leaf, tracer) for leaf in leaves)
