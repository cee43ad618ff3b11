"""``ConsoleConfig``: everything ``lmqadmin web`` was started with, one frozen object.

Every part of the console (the sampler, the pages, the actions, the live tail) receives this one
object, as hypercorn hands its ``Config`` to every server, rather than a fan of arguments.
"""

from __future__ import annotations

import attrs

from lmq_client.http import HTTPOptions
from lmq_client.transport import PLAIN, TransportOptions

__all__ = ["DEFAULT_ACL_HTTP_HEADER", "DEFAULT_LISTEN", "DEFAULT_SAMPLE_INTERVAL_S",
           "HISTORY_S", "ConsoleConfig"]

DEFAULT_LISTEN = "127.0.0.1:4171"
"""nsqadmin's port; loopback by default, as lmqadmin's other defaults (nsqadmin binds 0.0.0.0)."""

DEFAULT_ACL_HTTP_HEADER = "X-Forwarded-User"
"""nsqadmin's ``--acl-http-header`` default: the header a proxy in front sets to the user."""

DEFAULT_SAMPLE_INTERVAL_S = 5.0
"""How often the sampler asks every node for ``/stats``. Pages never ask the daemons for
statistics themselves, so this alone sets the console's load on them: one ``/stats`` per node
per interval, whatever the number of browsers. 5 s keeps the rates and charts current (nsqadmin
users watch rates over seconds) at a load a daemon does not notice (a ``/stats`` of 3,000
channels costs lmqd ~30 ms: docs/benchmarks.md, "Console")."""

HISTORY_S = 3600.0
"""The charts' memory: an hour of samples, as the issue asks (720 at the default interval)."""


def _strip_base_path(value: str) -> str:
    value = "/" + value.strip("/")
    return "" if value == "/" else value


@attrs.frozen(kw_only=True)
class ConsoleConfig:
    """What ``lmqadmin web`` was given (docs/console.md has each flag)."""

    http_addresses: tuple[str, ...] = ()
    """Nodes given with ``--http-address`` (HOST:PORT of their HTTP API)."""
    lookupd_http_addresses: tuple[str, ...] = ()
    """Lookupds whose nodes are shown too (``--lookupd-http-address``)."""
    http: HTTPOptions = attrs.field(factory=HTTPOptions)
    """Every request to the daemons and lookupds: timeouts and the TLS context of HTTPS (a
    daemon's plain port answering ``TLS_REQUIRED`` is asked again on its HTTPS port)."""
    transport: TransportOptions = PLAIN
    """TCP options for the live tail's consumer (TLS, compression, AUTH secret)."""
    base_path: str = attrs.field(default="", converter=_strip_base_path)
    """URL prefix every page and asset is served under (``--base-path``), "" or ``/x/y``."""
    read_only: bool = False
    admin_users: frozenset[str] = frozenset()
    """With users, only requests whose ``acl_http_header`` names one of them may act."""
    acl_http_header: str = DEFAULT_ACL_HTTP_HEADER
    notification_http_endpoint: str | None = None
    sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S

    @property
    def timeout_s(self) -> float:
        """Bound of each wait for a daemon (``--timeout``, ``--http-client-request-timeout``)."""
        return self.http.timeout_s

    @property
    def history_slots(self) -> int:
        """Samples kept for the charts: an hour's worth."""
        return max(2, round(HISTORY_S / self.sample_interval_s))
