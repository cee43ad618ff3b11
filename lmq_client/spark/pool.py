"""Producers kept open between the write tasks of one executor process.

Spark runs each write task in a Python worker, and by default reuses a worker for the next task
(``spark.python.worker.reuse``, true), so a stream's micro-batches run one after another in the
same few processes. Opening a connection per task costs a TCP (and maybe TLS) handshake,
IDENTIFY and AUTH each micro-batch; the pool keeps a task's producer open after the task
succeeded and hands it to the next task of the process that publishes with the same options.

* **Key**: the daemon addresses in the order the task tries them, the timeout and the
  transport options (TLS, compression, AUTH secret). Partition ``p`` always tries
  ``address[p % n]`` first, so its producer is only reused by tasks that would connect to the
  same daemon.
* **Checkout, not sharing**: ``take`` removes a producer from the pool, ``give_back`` returns
  it. Two tasks never share a connection (a worker runs one task at a time, but nothing here
  relies on that), and a task that failed closes its producer instead of giving it back: after
  an error its connection's state is unknown.
* **Idle connections**: a pooled producer whose daemon closed the connection meanwhile
  (restart, or heartbeats unanswered while idle: the daemon gives up after two, ~60 s by
  default) notices it before its next command and reconnects, so a stale connection costs
  nothing but the reconnect.
* **Fork**: PySpark starts workers by forking a daemon process. A pool that finds itself in a
  process other than the one that filled it (``os.getpid()`` changed) forgets the inherited
  producers without closing them: their sockets belong to the parent.
* **Exit**: ``atexit`` closes what is idle; a worker killed without running it leaves the
  sockets to the OS, which closes them (the daemon sees EOF either way).
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable, Hashable
from typing import Protocol, TypeVar

__all__ = ["MAX_IDLE_PER_KEY", "PRODUCERS", "ProducerPool"]

MAX_IDLE_PER_KEY = 2
"""Idle producers kept per key: a worker runs one task at a time, so one is what a worker
needs; the second covers a task that ran while another held the first (threads, tests). More
would only hold connections that nothing uses."""


class _Closable(Protocol):
    def close(self) -> None: ...


P = TypeVar("P", bound=_Closable)


class ProducerPool:
    """Idle producers of this process by ``(addresses, timeout, transport)``; thread-safe."""

    def __init__(self, *, max_idle_per_key: int = MAX_IDLE_PER_KEY) -> None:
        self.max_idle_per_key = max_idle_per_key
        self._idle: dict[Hashable, list[_Closable]] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self.created = 0
        """Producers made by ``take`` (the rest were reused), for tests and logs."""

    def take(self, key: Hashable, make: Callable[[], P]) -> P:
        """An idle producer for ``key``, or a new one from ``make()``."""
        with self._lock:
            self._check_process()
            idle = self._idle.get(key)
            if idle:
                producer = idle.pop()
                return producer  # type: ignore[return-value]
            self.created += 1
        return make()

    def give_back(self, key: Hashable, producer: _Closable) -> None:
        """``producer`` finished a task cleanly: keep it for the next (or close it if the pool
        holds enough for ``key``)."""
        with self._lock:
            self._check_process()
            idle = self._idle.setdefault(key, [])
            if len(idle) < self.max_idle_per_key:
                idle.append(producer)
                return
        producer.close()

    def idle_count(self) -> int:
        """Producers waiting in the pool."""
        with self._lock:
            return sum(len(idle) for idle in self._idle.values())

    def close_all(self) -> None:
        """Close every idle producer (at exit)."""
        with self._lock:
            idle = [p for producers in self._idle.values() for p in producers]
            self._idle.clear()
            mine = os.getpid() == self._pid
        if mine:
            for producer in idle:
                producer.close()

    def _check_process(self) -> None:
        pid = os.getpid()
        if pid != self._pid:  # forked: the parent's connections are not ours to use or close
            self._idle = {}
            self._pid = pid


PRODUCERS = ProducerPool()
"""The process's pool, used by ``write_partition``."""

atexit.register(PRODUCERS.close_all)
