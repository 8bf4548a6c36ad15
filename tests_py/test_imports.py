"""The package's shape: its modules import each other without cycles, leaf
modules stay leaves, no module hides behind a function of the same name,
and every public import path resolves.

The import graph is read from the sources: the AST of every .py file and
the Python-level imports of every .pyx file (cimports are C declarations,
not imports), imports inside functions included, relative and absolute.
"""

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import concord
from concord import _aliases

PACKAGE = Path(__file__).resolve().parent.parent / "pyext" / "concord"


# ---- reading the graph ------------------------------------------------------------

def _module_names(root):
    """{dotted module name: source file} of the package at `root`."""
    modules = {}
    for path in sorted([*root.rglob("*.py"), *root.rglob("*.pyx")]):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


_STRING = re.compile(r"""(?P<prefix>[rRbBuUfF]{0,2})(?P<quote>'''|\"\"\"|'|")""")


def _blank_strings_and_comments(source):
    """`source` with the text of string literals and comments replaced by
    spaces (newlines kept), so that no import is seen inside a docstring."""
    out, i = [], 0
    while i < len(source):
        char = source[i]
        if char == "#":
            end = source.find("\n", i)
            end = len(source) if end < 0 else end
            out.append(" " * (end - i))
            i = end
            continue
        match = _STRING.match(source, i) if char in "'\"rRbBuUfF" else None
        if match is None or (match.group("prefix") and i and (source[i - 1].isalnum()
                                                              or source[i - 1] == "_")):
            out.append(char)
            i += 1
            continue
        quote = match.group("quote")
        j = match.end()
        while j < len(source) and not source.startswith(quote, j):
            j += 2 if source[j] == "\\" else 1
        end = min(j + len(quote), len(source))
        out.append(re.sub(r"[^\n]", " ", source[i:end]))
        i = end
    return "".join(out)


_IMPORT_LINE = re.compile(r"^[ \t]*(import[ \t]|from[ \t]+\S+[ \t]+import\b)")


def _pyx_imports(source):
    """The Python import statements of Cython source, as parsed AST nodes."""
    lines = _blank_strings_and_comments(source).splitlines()
    nodes, index = [], 0
    while index < len(lines):
        line = lines[index]
        index += 1
        if not _IMPORT_LINE.match(line) or re.search(r"\bcimport\b", line):
            continue
        statement = [line.strip()]
        while (statement[-1].endswith("\\")
               or "".join(statement).count("(") > "".join(statement).count(")")):
            statement.append(lines[index].strip())
            index += 1
        nodes.extend(ast.parse("\n".join(statement)).body)
    return nodes


def _imports(path):
    source = path.read_text()
    if path.suffix == ".pyx":
        return _pyx_imports(source)
    return [node for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.Import, ast.ImportFrom))]


def import_graph(root):
    """{module: the package's modules it imports} for the package at `root`."""
    modules = _module_names(root)
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.stem == "__init__" else name.rpartition(".")[0]
        for node in _imports(path):
            if isinstance(node, ast.Import):
                graph[name].update(alias.name for alias in node.names if alias.name in modules)
                continue
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                if submodule in modules:
                    graph[name].add(submodule)
                elif target in modules:
                    graph[name].add(target)
        graph[name].discard(name)
    return graph


def find_cycles(graph):
    """One cycle per group of modules that import each other, each as the
    list of modules along it (first == last); none for an acyclic graph."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node):  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_in(graph, group) for group in groups]


def _cycle_in(graph, group):
    """A path around `group` (strongly connected): from its first module
    back to it, through the group only."""
    start = min(group)
    paths, seen = {start: [start]}, {start}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for other in sorted(graph[node] & group):
                if other == start:
                    return paths[node] + [start]
                if other not in seen:
                    seen.add(other)
                    paths[other] = paths[node] + [other]
                    following.append(other)
        frontier = following
    raise AssertionError(f"{sorted(group)} is not strongly connected")


def reachable(graph, start):
    """The modules `start` imports, directly or not."""
    seen, todo = set(), [start]
    while todo:
        for other in graph[todo.pop()]:
            if other not in seen:
                seen.add(other)
                todo.append(other)
    return seen


# ---- the reader itself, on a small package ------------------------------------------

def test_the_graph_reader_finds_cycles_through_pyx_and_function_imports(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from . import a\n")
    (package / "a.py").write_text("def late():\n    from .sub import b\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text("from pkg import c\n")
    (package / "c.pyx").write_text(
        '"""A docstring that says\nimport pkg.d\n"""\n'
        "from ._decl cimport (\n    thing,\n)\n"
        "cdef int f(x) except? -1:\n"
        "    from .sub.b import (\n        name,\n    )\n"
        "    return 0\n")
    (package / "d.py").write_text("")
    graph = import_graph(package)
    assert graph == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.sub.b"}, "pkg.sub": set(),
                     "pkg.sub.b": {"pkg.c"}, "pkg.c": {"pkg.sub.b"}, "pkg.d": set()}
    assert find_cycles(graph) == [["pkg.c", "pkg.sub.b", "pkg.c"]]


# ---- concord ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def graph():
    return import_graph(PACKAGE)


def test_the_package_has_no_import_cycle(graph):
    cycles = find_cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_pyx_imports_are_read(graph):
    assert {"concord.errors", "concord._constants", "concord._streams"} <= graph["concord._capi"]


@pytest.mark.parametrize("module, allowed", [
    ("concord._constants", set()),
    ("concord._aliases", set()),
    ("concord._on_import", set()),
    ("concord.errors", {"concord._constants"}),
    ("concord._world", {"concord.errors", "concord._constants"}),
])
def test_leaf_modules_import_no_more_than_they_may(graph, module, allowed):
    assert reachable(graph, module) <= allowed


def test_collectives_reach_the_world_without_the_communicator_module(graph):
    assert "concord._world" in graph["concord.collectives"]
    assert "concord.communicator" not in reachable(graph, "concord.collectives")


def test_no_module_is_hidden_by_a_name_of_the_package():
    """`concord.world` and `concord.launch` are functions: a module of the
    same name could only be imported past them."""
    submodules = {info.name for info in pkgutil.iter_modules(concord.__path__)}
    shadowed = sorted(name for name in vars(concord)
                      if name in submodules and not inspect.ismodule(getattr(concord, name)))
    assert not shadowed
    assert callable(concord.world) and callable(concord.launch)


# ---- the public import paths ------------------------------------------------------------

@pytest.mark.parametrize("module", ["concord", "concord.collectives", "concord.communicator",
                                    "concord.data_parallel", "concord.errors", "concord.mesh",
                                    "concord.metrics", "concord.notebook", "concord.optim",
                                    "concord.sharded", "concord.training"])
def test_every_public_name_resolves(module):
    imported = importlib.import_module(module)
    missing = [name for name in imported.__all__ if not hasattr(imported, name)]
    assert not missing


def test_names_reachable_through_several_modules_are_the_same_objects():
    from concord import data_parallel, metrics, notebook, sharded, training

    assert data_parallel.ShardedArray is sharded.ShardedArray
    assert data_parallel.GradientSynchronizer is training.GradientSynchronizer
    assert data_parallel.train_step is training.train_step
    assert concord.launch is notebook.launch
    assert concord.launch.LaunchError is notebook.LaunchError
    assert metrics.reduce_mean is metrics.functional.reduce_mean


def test_the_jax_libraries_names_are_bound_as_the_table_says():
    from concord import data_parallel, metrics

    for alias, name in _aliases.FUNCTIONS.items():
        assert getattr(data_parallel, alias) is getattr(data_parallel, name), alias
        assert alias in data_parallel.__all__
    for alias, name in _aliases.METHODS.items():
        assert getattr(data_parallel.DataParallel, alias) is getattr(data_parallel.DataParallel,
                                                                     name), alias
    for alias, name in _aliases.STATIC.items():
        assert getattr(data_parallel.DataParallel, alias) is getattr(data_parallel, name), alias
    for alias, name in _aliases.COLLECTIVES.items():
        collective = getattr(metrics, alias)
        assert collective.__name__ == alias and alias in metrics.__all__
        assert inspect.signature(collective).parameters["axis_name"].default == "batch"
