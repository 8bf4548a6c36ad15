"""env:// in jobs started by concord's launchers (concord-run, concord.launch).

Their ranks get RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, but the port
is taken by the launcher's concord store: torch's env:// handler would start
its TCPStore there and fail (address in use). Installed by importing
concord.torch, the env:// handler below serves such a job differently: rank
0 starts torch's TCPStore on a free port of MASTER_ADDR and publishes the
port through the launcher's store, where the other ranks read it. Jobs of
other launchers (torchrun, ...) go to torch's own handler unchanged.
"""

import importlib
import os
from urllib.parse import parse_qsl, urlparse

import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

from .. import _capi
from ._errors import translated


def _launcher_store_address():
    """(host, port, token) of the concord store a launcher serves on
    MASTER_PORT, or None when MASTER_PORT is free for torch."""
    env = os.environ
    if env.get("CONCORD_STORE_SERVER") != "launcher" or not env.get("CONCORD_JOB_TOKEN"):
        return None
    port = env.get("CONCORD_MASTER_PORT", env.get("MASTER_PORT"))
    if port is None or port != env.get("MASTER_PORT"):
        return None
    host = env.get("CONCORD_MASTER_ADDR", env.get("MASTER_ADDR"))
    return host, int(port), env["CONCORD_JOB_TOKEN"]


def _rank_and_world(url):
    """torch's rule: the URL's query (init_process_group puts explicit
    arguments there), else RANK and WORLD_SIZE."""
    query = dict(parse_qsl(urlparse(url).query))
    return (int(query.get("rank", os.environ["RANK"])),
            int(query.get("world_size", os.environ["WORLD_SIZE"])))


def _through_launcher_store(url, launcher, timeout):
    host, port, token = launcher
    rank, world_size = _rank_and_world(url)
    with translated(), _capi.Store(host, port, token, timeout.total_seconds()) as launcher_store:
        # Each rendezvous counts: a job may initialise torch more than once.
        generation = launcher_store.add(f"torch/env/generation/{rank}", 1)
        key = f"torch/env/{generation}/port"
        if rank == 0:
            store = dist.TCPStore(host, 0, world_size, True, timeout, wait_for_workers=False)
            launcher_store.set(key, str(store.port).encode())
        else:
            torch_port = int(launcher_store.get(key))
            store = dist.TCPStore(host, torch_port, world_size, False, timeout)
    yield store, rank, world_size
    raise RuntimeError("Unable to perform re-rendezvous using env:// method")


def install():
    """Wraps torch's env:// handler (torch lets no handler be registered
    again for a scheme, so the table itself is updated)."""
    # The module, not the function torch.distributed exports under its name.
    handlers = importlib.import_module("torch.distributed.rendezvous")._rendezvous_handlers
    torch_handler = handlers["env"]

    def env_handler(url, **kwargs):
        launcher = _launcher_store_address()
        if launcher is None:
            return torch_handler(url, **kwargs)
        return _through_launcher_store(url, launcher, kwargs.get("timeout", default_pg_timeout))

    handlers["env"] = env_handler
