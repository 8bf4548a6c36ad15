"""Ranks of a torchrun job that spans several hosts meet through torch's
own store.

torchrun serves its store on MASTER_ADDR:MASTER_PORT and gives the ranks
no secret. On one host the C library copes by itself (the ranks meet
through a private file); across hosts, rank 0 serves concord's store on a
free port of the interface it reaches MASTER_ADDR through, with a fresh
secret, and publishes address, port and secret in torch's store, where
every rank reads them. torch's store serves anyone who can reach it, so the
secret is as private as the job's torch store: that of the job itself.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
from dataclasses import dataclass
from datetime import timedelta

from . import _capi

__all__ = ["PublishedStore", "published_store"]


@dataclass
class PublishedStore:
    """Where concord's store is, and on rank 0 the server itself."""

    host: str
    port: int
    token: str
    server: object = None  # a _capi.StoreServer on rank 0


def _spans_several_hosts(world_size):
    """Whether this torchrun job spans several hosts and gave concord no
    store of its own (no CONCORD_JOB_TOKEN or CONCORD_MASTER_PORT)."""
    env = os.environ
    if env.get("CONCORD_JOB_TOKEN") or env.get("CONCORD_MASTER_PORT"):
        return False
    return world_size > 1 and env.get("LOCAL_WORLD_SIZE") != str(world_size)


def _local_address_towards(host, port):
    """The address of this host's interface that reaches host:port (no
    packet is sent: a datagram socket only picks its route)."""
    family = socket.getaddrinfo(host, port, proto=socket.IPPROTO_UDP)[0][0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((host, port))
        return probe.getsockname()[0]


def published_store(rank, world_size, timeout_s):
    """The store of a torchrun job spanning several hosts, or None for any
    other job. Rank 0 serves it (the returned server must live as long as
    the communicator); every rank waits for it at most `timeout_s` seconds
    (None: torch's default)."""
    env = os.environ
    if "TORCHELASTIC_RUN_ID" not in env:
        return None
    rank = int(env["RANK"]) if rank is None else rank
    world_size = int(env["WORLD_SIZE"]) if world_size is None else world_size
    if not _spans_several_hosts(world_size):
        return None
    import torch.distributed as dist  # torchrun's ranks have torch

    master_addr, master_port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    options = {}
    if timeout_s is not None and timeout_s < timedelta.max.total_seconds():
        options["timeout"] = timedelta(seconds=timeout_s)
    torch_store = dist.TCPStore(master_addr, master_port, is_master=False, **options)
    # A restarted job (torchrun --max-restarts) meets anew.
    key = (f"concord/store/{env['TORCHELASTIC_RUN_ID']}/"
           f"{env.get('TORCHELASTIC_RESTART_COUNT', '0')}")
    if rank != 0:
        return PublishedStore(*json.loads(torch_store.get(key)))
    host = _local_address_towards(master_addr, master_port)
    token = secrets.token_hex(16)
    server = _capi.StoreServer(host, 0, token)
    torch_store.set(key, json.dumps([host, server.port, token]))
    return PublishedStore(host, server.port, token, server)
