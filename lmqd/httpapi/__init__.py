"""nsqd's HTTP API (``/ping``, ``/info``, ``/pub``, ``/mpub``, ``/stats``, topic/channel admin,
``/config``) and Prometheus ``/metrics``, served by hypercorn on trio.

``serve_http(daemon, address, task_status=...)`` is what ``Broker.run`` starts; ``HttpApi`` is
the ASGI application itself (usable without a socket, e.g. in tests).
"""

from lmqd.httpapi.api import HttpApi
from lmqd.httpapi.server import serve_http

__all__ = ["HttpApi", "serve_http"]
