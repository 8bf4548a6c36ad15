"""torch.distributed on concord.

    import concord.torch  # registers the backend
    torch.distributed.init_process_group(backend="concord")

Importing this module registers "concord" as a torch.distributed backend
for CPU tensors (concord's shared-memory backend) and CUDA tensors (NCCL
through concord), so torch's collectives, new_group and
DistributedDataParallel run on concord, and offers allreduce_mean_hook, a
DDP communication hook that averages each bucket within the reduction. It
also lets env:// work in jobs started by concord-run. `import concord`
alone never imports torch.
"""

from . import _backend, _launcher_store
from ._backend import NAME, SUPPORTED
from ._hooks import allreduce_mean_hook

__all__ = ["NAME", "SUPPORTED", "allreduce_mean_hook"]

_backend.register()
_launcher_store.install()
