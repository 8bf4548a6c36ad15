"""The rank side of the multi-process GPU tests (conftest's `process_ranks`
fixture).

    python -m concord.run -n N tests_py/gpu_helpers.py MODULE_FILE FUNCTION ARGS_JSON OUT_DIR

Each rank is a fresh process (a process forked from one holding a CUDA
context cannot use CUDA): it imports the test module from MODULE_FILE, calls
FUNCTION(*ARGS) and writes the JSON of its result to OUT_DIR/rank<RANK>.json.
An exception ends the rank with its traceback on stderr and a non-zero exit
status, which the launcher reports.

The GPU itself is chosen by the function (several ranks may share one GPU:
see test_gpu_collectives.share_the_gpu).
"""

import importlib.util
import json
import os
import sys
from pathlib import Path


def load_module(path):
    """The module at `path`, imported under a private name."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"_concord_gpu_test_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv):
    module_file, function, args, out_dir = argv
    fn = getattr(load_module(module_file), function)
    result = fn(*json.loads(args))
    rank = os.environ["RANK"]
    path = Path(out_dir) / f"rank{rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
