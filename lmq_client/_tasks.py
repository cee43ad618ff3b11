"""The async clients' task groups, owned by ``async with`` and transparent to errors."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio
from anyio.abc import TaskGroup

__all__ = ["owned_task_group"]


@contextlib.asynccontextmanager
async def owned_task_group() -> AsyncIterator[TaskGroup]:
    """A task group for a client's own tasks, cancelled when the body ends. An exception from
    the body reaches the caller as itself, not wrapped in an exception group (the client's tasks
    do not raise); a cancellation is left to the scope it belongs to."""
    error: BaseException | None = None
    async with anyio.create_task_group() as tasks:
        try:
            yield tasks
        except anyio.get_cancelled_exc_class():
            raise
        except BaseException as exc:
            error = exc
        finally:
            tasks.cancel_scope.cancel()
    if error is not None:
        raise error
