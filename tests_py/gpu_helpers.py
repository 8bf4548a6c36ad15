"""The rank side of the tests whose ranks are fresh processes started by a
launcher: the GPU tests (conftest's `process_ranks` fixture) and the ranks
on test hosts (test_multihost.py).

    python -m concord.run -n N tests_py/gpu_helpers.py MODULE_FILE FUNCTION ARGS_JSON OUT_DIR

Each rank is a fresh process (a process forked from one holding a CUDA
context cannot use CUDA): it imports the test module from MODULE_FILE, calls
FUNCTION(*ARGS) and writes the JSON of its result to OUT_DIR/rank<RANK>.json.
An exception ends the rank with its traceback on stderr and a non-zero exit
status, which the launcher reports.

The GPU itself is chosen by the function (several ranks may share one GPU:
see test_gpu_collectives.share_the_gpu).
"""

import json
import os
import sys
from pathlib import Path

from helpers import load_module  # this directory is sys.path[0] for a script


def main(argv):
    module_file, function, args, out_dir = argv
    module = load_module(module_file, f"_concord_gpu_test_{Path(module_file).stem}")
    fn = getattr(module, function)
    result = fn(*json.loads(args))
    # The rank as its launcher numbers it: mpirun and srun set no RANK.
    rank = next(os.environ[name] for name in ("RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")
                if name in os.environ)
    path = Path(out_dir) / f"rank{rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
