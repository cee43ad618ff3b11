"""nsqadmin's ``--notification-http-endpoint``: one JSON POST per admin action.

The document is nsqadmin's ``AdminAction``, key for key (``action``, ``topic``, ``channel``,
``node``, ``timestamp``, ``user``, ``remote_ip``, ``user_agent``, ``url``, ``via``), with
nsqadmin's action names (``create_topic``, ``delete_channel``, ``tombstone_topic_producer``...)
and lmq's own for what nsqadmin cannot do (``replay_channel``, ``redrive_channel``,
``topic_policy``, ``channel_policy``). As in nsqadmin it is sent in the background after the
action: a slow or failing endpoint delays no page, and a failure is logged, not shown.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from typing import Any

import trio

from lmq_client.admin.web.asgi import Request
from lmq_client.admin.web.config import ConsoleConfig
from lmq_client.admin.web.upstream import Upstream
from lmq_client.errors import LmqClientError
from lmq_client.http import HTTPClient

__all__ = ["Notifier"]

log = logging.getLogger("lmq_client.admin.web")


class Notifier:
    def __init__(self, config: ConsoleConfig, upstream: Upstream, nursery: trio.Nursery) -> None:
        self.config = config
        self.upstream = upstream
        self.nursery = nursery
        self.via = socket.gethostname()

    def action(
        self, request: Request, user: str, action: str, topic: str, channel: str = "",
        node: str = "",
    ) -> None:
        """Send nsqadmin's notification for ``action`` (in the background), if configured."""
        endpoint = self.config.notification_http_endpoint
        if not endpoint:
            return
        doc: dict[str, Any] = {"action": action, "topic": topic}
        if channel:
            doc["channel"] = channel
        if node:
            doc["node"] = node
        doc["timestamp"] = int(time.time())
        if user:
            doc["user"] = user
        forwarded = request.headers.get("x-forwarded-for", "").split(",")[0].strip()
        doc["remote_ip"] = request.headers.get("x-real-ip") or forwarded or request.client
        doc["user_agent"] = request.headers.get("user-agent", "")
        query = f"?{request.raw_query}" if request.raw_query else ""
        doc["url"] = self.config.base_path + request.path + query
        doc["via"] = self.via
        self.nursery.start_soon(self._post, endpoint, json.dumps(doc).encode())

    async def _post(self, endpoint: str, body: bytes) -> None:
        try:
            await self.upstream.run(
                HTTPClient.fetch, endpoint, address=endpoint, timeout=self.config.timeout_s,
                method="POST", body=body, headers={"Content-Type": "application/json"},
            )  # fmt: skip
        except LmqClientError as exc:
            log.warning("notification to %s failed: %s", endpoint, exc)
