"""The Work torch's callers hold for a collective on the concord backend,
and the thread that completes a group's collectives in issue order.

Callers meet a Work in two ways: ``work.wait()`` (every synchronous
torch.distributed call, and ``async_op=True`` users), and
``work.get_future()``, on which DDP chains its bucket callbacks and whose
``wait()`` it calls from C++. Both must report concord's error: wait()
raises it as DistBackendError, and the future fails for C++ waiters too.
"""

import queue
import threading

import torch
import torch.distributed as dist

from ._errors import backend_error


def _value_or_raise(future):
    # torch.futures.Future.set_exception fails a future for Python's wait()
    # only; C++ waiters would take the exception for a value. A callback
    # that raises fails the future it returns for both.
    value = future.value()
    if isinstance(value, BaseException):
        raise value
    return value


class Work(dist._Work):
    """A collective's outcome: `result` (the list of tensors torch expects
    from its future) once complete() was called, or complete(error)'s
    error. `devices` are the CUDA devices of the result (empty for host
    tensors): its future then records an event on their current streams
    when completed, and waiting makes the waiter's streams wait for it."""

    def __init__(self, result, devices=()):
        super().__init__()
        self._result = result
        self._finished = threading.Event()
        self._error = None
        self._completion = torch.futures.Future(devices=list(devices))
        self._future = self._completion.then(_value_or_raise)

    def complete(self, error=None):
        self._error = error
        self._finished.set()
        self._completion.set_result(self._result if error is None else error)

    def wait(self, timeout=None):
        # torch passes its "no timeout" as a zero timedelta: the
        # communicator's own timeout then bounds the collective.
        seconds = timeout.total_seconds() if timeout else None
        if not self._finished.wait(seconds):
            raise dist.DistBackendError(
                f"concord: the collective did not finish within the {seconds} s waited for it")
        if self._error is not None:
            raise self._error
        self._future.wait()  # on CUDA: the current streams wait for the result
        return True

    def get_future(self):
        return self._future


def _complete_in_order(pending):
    while (item := pending.get()) is not None:
        concord_work, finish, work = item
        try:
            concord_work.wait()
            if finish is not None:
                finish()
        except Exception as error:  # the waiters get it; this thread serves the next
            work.complete(backend_error(error))
        else:
            work.complete()


class Completions:
    """One thread completing a group's asynchronous collectives: it waits
    for each of concord's Work in issue order (the order concord runs them
    in), runs its `finish` (copies out of a staging buffer), then completes
    torch's Work, which runs the callbacks chained on its future."""

    def __init__(self, name):
        self._pending = queue.SimpleQueue()
        self._thread = threading.Thread(target=_complete_in_order, args=(self._pending,),
                                        name=name, daemon=True)
        self._thread.start()

    def add(self, concord_work, finish, work):
        self._pending.put((concord_work, finish, work))

    def close(self):
        """Returns once every collective added before finished."""
        if self._thread.is_alive():
            self._pending.put(None)
            self._thread.join()
