"""Every fenced code block of README.md and docs/*.md runs, so the docs
cannot rot: Python blocks of a job's ranks under concord-run, notebook
blocks as a notebook runs them (a trailing ``# -> value`` is checked),
shell blocks in a scratch directory holding the files they name. A block
that cannot run here says why in BLOCKS; a block missing from BLOCKS fails,
so a new one is either run or explicitly skipped."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_TIMEOUT_S = 180


def _blocks():
    for path in DOCS:
        for index, match in enumerate(_FENCE.finditer(path.read_text())):
            yield pytest.param(path.relative_to(ROOT).as_posix(), match.group(2),
                               id=f"{path.relative_to(ROOT).as_posix()}#{index}")


# (file, the block's first line) -> how it runs: ("ranks", n, *blocks run
# before it), ("notebook", {file: content}), ("shell", {file: content}, [what
# its output must hold]), ("build_info",), ("demo",), or ("skip", why). A
# file's content may be a tuple of parts: texts and "page#index" references
# to other blocks, joined.
_PRINT_ARGS = "import sys; print(sys.argv[1:])\n"
# Runs the JAX page's train_step once on every rank's batch; the ranks'
# parameters must come out identical.
_JAX_STEP = """
import numpy as np
rng = np.random.default_rng(concord.rank())
params = {"w1": jnp.ones((3, 4)) * 0.1, "b1": jnp.zeros(4), "w2": jnp.ones((4, 1)) * 0.1,
          "b2": jnp.zeros(1)}
batch = (jnp.asarray(rng.standard_normal((8, 3)), jnp.float32), jnp.ones((8, 1)))
params = train_step(params, batch)
flat = np.concatenate([np.ravel(leaf) for leaf in jax.tree.leaves(params)])
assert np.array_equal(concord.broadcast(flat, 0), flat)
print("trained")
"""
# One write per rank: the ranks under torchrun share one pipe.
_TORCH_DONE = 'import sys; sys.stdout.write(f"trained {rank}\\n")\n'
BLOCKS = {
    ("README.md", "make demo   # installs what is missing, builds, installs the package, "
                  "trains an MLP on 4 ranks"): ("demo",),
    ("README.md", "import numpy as np"): ("ranks", 2),
    ("README.md", "concord-run -n 4 script.py args     # or: python -m concord.run -n 4 "
                  "script.py"): ("shell", {"script.py": _PRINT_ARGS},
                                 [f"[{rank}] ['args']" for rank in range(4)]),
    ("docs/c_abi.md", "PKG_CONFIG_PATH=$(python -m concord --pkgconfigdir) \\"):
        ("shell", {"app.c": (ROOT / "examples" / "c" / "allreduce.c").read_text()}, []),
    ("README.md", "pip install .                 # builds with meson-python; pulls NumPy, "
                  "optree, array-api-compat"):
        ("skip", "installs the package: make test installs it the same way first"),
    ("docs/c_abi.md", "concord_comm_all_reduce(comm, send, recv, op, stream, work);"):
        ("skip", "a list of calls, not a program: examples/c/allreduce.c is the complete "
                 "one, built and run by test_c_example.py"),
    ("docs/c_abi.md", "concord_grad_sync_options o = CONCORD_GRAD_SYNC_OPTIONS_INIT;  /* 25 MiB, "
                      "first 1 MiB, mean, no compression */"):
        ("skip", "a list of calls, not a program"),
    ("docs/gpu.md", '>>> cc.build_info()["cuda"]'): ("build_info",),
    ("docs/guide.md", "Python package concord  (pyext/: Cython _capi over the C ABI, "
                      "pure-Python API:"): ("skip", "a diagram of the layers"),
    ("docs/guide.md", "export CONCORD_JOB_TOKEN=$(openssl rand -hex 16)   # once, shared by "
                      "the job script"):
        ("skip", "needs several machines: test_multihost.py starts the same launchers on test "
                 "hosts"),
    ("docs/guide.md", "concord-run -n 4 train.py --epochs 3"):
        ("shell", {"train.py": _PRINT_ARGS, "mypackage/__init__.py": "",
                   "mypackage/train.py": _PRINT_ARGS},
         [*(f"[{rank}] ['--epochs', '3']" for rank in range(4)),
          *(f"[{rank}] []" for rank in range(4))]),
    ("docs/guide.md", "import numpy as np"): ("notebook", {}),
    ("docs/guide.md", "import concord as cc"): ("notebook", {"mytraining.py": (
        "import concord as cc\n"
        "import numpy as np\n\n"
        "def work(scale):\n"
        "    cc.init()\n"
        "    return float(cc.all_reduce(np.ones(1) * scale * cc.rank())[0])\n")}),
    ("docs/jax.md", "import functools"): ("ranks", 2),
    ("docs/jax.md", "import concord"): ("ranks", 2, "docs/jax.md#0"),
    ("docs/jax.md", "concord-run -n 4 train.py"):
        ("shell", {"train.py": ("docs/jax.md#0", "docs/jax.md#1", _JAX_STEP)},
         [f"[{rank}] trained" for rank in range(4)]),
    ("docs/jax.md", "import concord.jax as cj"): ("skip", "signatures"),
    ("docs/python_api.md", "import concord.jax as cj"): ("skip", "signatures"),
    ("docs/jax.md", "FAILED_PRECONDITION: concord.jax all_reduce: MismatchError: all_reduce #0: "
                    "ranks disagree"): ("skip", "an error message as JAX prints it"),
    ("docs/jax.md", '>>> concord.build_info()["jax"]'): ("build_info",),
    ("docs/pytorch.md", "import torch"): ("ranks", 2),
    ("docs/pytorch.md", "torchrun --standalone --nproc-per-node 4 train.py"):
        ("shell", {"train.py": ("docs/pytorch.md#0", _TORCH_DONE)},
         [f"trained {rank}" for rank in range(4)]),
    ("docs/pytorch.md", "concord-run -n 4 train.py"):
        ("shell", {"train.py": ("docs/pytorch.md#0", _TORCH_DONE)},
         [f"[{rank}] trained {rank}" for rank in range(4)]),
    ("docs/python_api.md", 'cc.all_reduce(x, op="sum", *, comm=None, out=None, '
                           'async_op=False)'): ("skip", "signatures"),
    ("docs/python_api.md", 'mesh = cc.make_mesh((2, 2), ("data", "fsdp"))   # row-major over the '
                           'world, like jax.make_mesh'):
        ("skip", "a summary of calls, alternatives joined by '/'"),
    ("docs/python_api.md", "sync = GradientSynchronizer(params, comm=None, bucket_cap_mb=25, "
                           "first_bucket_mb=1,"): ("skip", "signatures with placeholders"),
}


def _block(reference):
    """The text of the block "page#index" (its index among the page's
    fenced blocks)."""
    page, _, index = reference.partition("#")
    return list(_FENCE.finditer((ROOT / page).read_text()))[int(index)].group(2)


def _joined(parts):
    """A tuple of texts and block references as one text."""
    return "\n".join(_block(part) if re.fullmatch(r"[\w/.]+\.md#\d+", part) else part
                     for part in parts)


def _key(path, text):
    return path, text.splitlines()[0] if text.strip() else ""


# Whole pages whose blocks cannot run here, and why.
PAGES_SKIPPED = {
    "docs/julia.md": "Julia is not installed here: the page's struct layouts, option defaults "
                     "and constants are checked against the C header by test_julia_layout.py",
}


def _how(path, text):
    if path in PAGES_SKIPPED:
        pytest.skip(f"{path}: {PAGES_SKIPPED[path]}")
    how = BLOCKS.get(_key(path, text))
    if how is None:
        pytest.fail(f"{path}: a code block that test_docs.py neither runs nor skips: "
                    f"{text.splitlines()[:1]}; add it to BLOCKS")
    if how[0] == "skip":
        pytest.skip(f"{path}: {how[1]}")
    return how


def _scratch(tmp_path, files):
    """A directory holding `files`, and an environment whose PATH finds
    this interpreter as `python` and concord-run for it."""
    for name, content in files.items():
        content = _joined(content) if isinstance(content, tuple) else content
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(content)
    bin_dir = tmp_path / ".bin"
    bin_dir.mkdir()
    # Scripts, not links: a link to a virtual environment's interpreter
    # from elsewhere would not be in the environment.
    for name, command in (("python", ""), ("concord-run", "-m concord.run ")):
        wrapper = bin_dir / name
        wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" {command}"$@"\n')
        wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    return dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def _run(command, **kwargs):
    result = subprocess.run(command, capture_output=True, text=True, timeout=_TIMEOUT_S,
                            **kwargs)
    assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
    return result


def _checked_results(text):
    """The block with each `expression  # -> value` line turned into an
    assertion that the expression gives the value."""
    lines = []
    for line in text.splitlines():
        code, arrow, expected = line.partition("# -> ")
        if arrow:
            expression = code.strip()
            line = (f"assert ({expression}) == {expected.strip()}, "
                    f"({expression!r}, {expression})")
        lines.append(line)
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("path, text", list(_blocks()))
def test_docs_block_runs(tmp_path, path, text):
    how = _how(path, text)
    kind = how[0]
    if kind == "ranks":
        script = tmp_path / "block.py"
        script.write_text(_joined((*how[2:], text)))
        _run([sys.executable, "-m", "concord.run", "-n", str(how[1]), str(script)])
    elif kind == "notebook":
        # Like a notebook's kernel, `python -c` has no main file (which
        # spawned ranks would import again).
        _run([sys.executable, "-c", _checked_results(text)], cwd=tmp_path,
             env=_scratch(tmp_path, how[1]))
    elif kind == "shell":
        _, files, expected = how
        if "app.c" in files and not (shutil.which("cc") and shutil.which("pkg-config")):
            pytest.skip(f"{path}: needs a C compiler (cc) and pkg-config")
        result = _run(["bash", "-e", "-c", text], cwd=tmp_path, env=_scratch(tmp_path, files))
        lines = result.stdout.splitlines()
        assert sorted(lines) == sorted(expected), result.stdout
    elif kind == "build_info":
        _check_build_info(text)
    else:
        _check_demo(text)


def _check_build_info(text):
    """Each `>>> expression` gives a dict with the documented keys (the
    values are this machine's)."""
    documented = []
    for chunk in text.split(">>> ")[1:]:
        expression, _, shown = chunk.partition("\n")
        documented.append((expression, ast.literal_eval(shown.strip())))
    program = ("import json, concord, concord as cc\n"
               f"print(json.dumps([sorted(eval(e)) for e in {[e for e, _ in documented]!r}]))")
    # In a process of its own: build_info() initialises CUDA where there is one.
    keys = json.loads(_run([sys.executable, "-c", program]).stdout)
    assert keys == [sorted(shown) for _, shown in documented]


def _check_demo(text):
    """`make demo` installs, then runs the Makefile's demo command: that
    command runs (for two epochs), and its progress lines carry one rank
    prefix each. `make test` runs this very suite."""
    assert text.splitlines()[1].startswith("make test")
    recipe = re.search(r"^demo:.*\n\t(.*)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert recipe == "$(PYTHON) -m concord.run -n $(NPROCS) examples/train_mlp.py"
    result = _run([sys.executable, "-m", "concord.run", "-n", "4",
                   str(ROOT / "examples" / "train_mlp.py"), "--epochs", "2"])
    assert "OK" in result.stdout and "[0] [0]" not in result.stdout
