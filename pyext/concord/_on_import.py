"""Calling a function with a module once it is imported, without importing
it: concord integrates with libraries it does not depend on (JAX's pytree
registry) whether they are imported before concord or after it.

A finder at the front of sys.meta_path watches for the module's import and
hands the spec the other finders made a loader that runs the module, then
the function; it does nothing else. Asking for the spec alone
(importlib.util.find_spec, as availability checks do) runs nothing: the
function runs when the module does, once.
"""

import sys

__all__ = ["when_imported"]


def when_imported(name, call):
    """call(module) once module `name` is imported: now if it already is,
    else right after its code ran (before the import returns to whoever
    asked for it)."""
    module = sys.modules.get(name)
    if module is not None:
        call(module)
    else:
        sys.meta_path.insert(0, _Watch(name, call))


class _Watch:
    """The finder watching for one module's import."""

    def __init__(self, name, call):
        self._name = name
        self._call = call
        self._done = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self._name:
            return None
        # The spec the finders after this one make, as the import would get
        # it without this one.
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if hasattr(spec.loader, "exec_module"):
            spec.loader = _ThenCall(spec.loader, self)
        return spec

    def ran(self, module):
        # Specs asked for before the import may be run later too (a
        # module imported again after leaving sys.modules): once is all.
        if self._done:
            return
        self._done = True
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        self._call(module)


class _ThenCall:
    """A module's own loader, and the watch to tell once the module ran."""

    def __init__(self, loader, watch):
        self._loader = loader
        self._watch = watch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        # The module keeps its own loader: its resources, source and
        # submodules are found through it.
        module.__loader__ = module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        self._watch.ran(module)
