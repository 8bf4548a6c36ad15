"""The concord communicator of one torch process group, met through the
store torch gives the group's backend.

torch hands a backend a c10d store shared by the group's ranks (a prefix
of the job's store, whatever launched the job: torchrun, concord-run, a
tcp:// or file:// init_method). concord's communicators meet through a
concord store, so the group's rank 0 serves one (on a free port, with a
fresh secret) and publishes where through torch's store; every rank then
joins the communicator through it. Nothing beyond what torch was given is
needed, and the default group and subgroups are made the same way: torch
calls a subgroup's backend on the subgroup's members only, so a split of
the world (collective over all its ranks) cannot make them.
"""

import json
import secrets
import socket

import torch.distributed as dist

from .. import _capi

LOOPBACK = "127.0.0.1"


def advertised_host(store):
    """The address of this host that the group's other ranks reach: the
    one that routes to torch's TCPStore host (loopback when that is this
    host), else loopback (other stores do not say where their ranks are)."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    if not isinstance(store, dist.TCPStore):
        return LOOPBACK
    try:
        address = socket.getaddrinfo(store.host, store.port, socket.AF_INET, socket.SOCK_DGRAM)[0]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(address[4])  # a datagram socket's connect sends nothing
            return probe.getsockname()[0]
    except OSError:  # unresolvable or unroutable: only this host's ranks can meet
        return LOOPBACK


class GroupComm:
    """A group's communicator (`comm`, a _capi.Comm) with the store it met
    through, which it keeps using (the CUDA backend meets there on the
    first CUDA collective), and on rank 0 the server of that store."""

    def __init__(self, torch_store, rank, size, timeout_s):
        # Each joining counts: a store that outlives a process group (the
        # agent's store under torchrun) may hold an earlier endpoint.
        generation = torch_store.add(f"concord/generation/{rank}", 1)
        key = f"concord/{generation}/store"
        self.server = None
        if rank == 0:
            host = advertised_host(torch_store)
            token = secrets.token_hex(16)
            self.server = _capi.StoreServer(host, 0, token)
            torch_store.set(key, json.dumps([host, self.server.port, token]))
        host, port, token = json.loads(torch_store.get(key))
        self.store = _capi.Store(host, port, token, timeout_s)
        self.comm = _capi.Comm.from_store(self.store, "torch", rank, size, timeout_s)

    def abort(self):
        if not self.comm.closed:
            self.comm.abort()

    def close(self):
        self.comm.close()
        self.store.close()
        if self.server is not None:
            self.server.close()
