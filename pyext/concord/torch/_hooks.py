"""A DistributedDataParallel communication hook for process groups on the
concord backend."""

import torch.distributed as dist


def allreduce_mean_hook(process_group, bucket):
    """Averages each gradient bucket over the group with one all-reduce of
    ReduceOp.AVG, which concord computes within the reduction; DDP's own
    hook divides the bucket by the group's size first, one more pass over
    its memory. Register it with ``ddp.register_comm_hook(group,
    allreduce_mean_hook)``; ``group`` None is the default group, which (or
    the group given) must be on the concord backend."""
    group = process_group if process_group is not None else dist.group.WORLD
    tensor = bucket.buffer()
    work = dist.all_reduce(tensor, op=dist.ReduceOp.AVG, group=group, async_op=True)
    return work.get_future().then(lambda _: tensor)
