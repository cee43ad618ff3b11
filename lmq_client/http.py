"""A small blocking client for nsqd's HTTP API (``/stats``, topic and channel admin, ``/pub``);
``HTTPClient.fetch`` is also what lookupd queries use (``lmq_client.lookupd``).

Standard library only (``urllib.request``): lmqadmin makes a handful of requests, so a pooled
HTTP client would buy nothing. Works against lmqd and nsqd alike (both answer errors as
``{"message": "CODE"}``).
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from lmq_client.errors import ConnectionFailed, LmqClientError
from lmqd.net import split_address

__all__ = ["HTTPClient", "HTTPError"]


class HTTPError(LmqClientError):
    """The daemon answered with an HTTP error: ``status`` and ``message`` (TOPIC_NOT_FOUND...)."""

    def __init__(self, address: str, status: int, message: str) -> None:
        super().__init__(f"{address}: HTTP {status} {message}")
        self.address = address
        self.status = status
        self.message = message


class HTTPClient:
    """nsqd's HTTP API at ``address`` (``HOST:PORT``)."""

    def __init__(self, address: str, *, timeout: float = 5.0) -> None:
        split_address(address)
        self.address = address
        self.timeout = timeout

    def request(
        self,
        method: str,
        path: str,
        params: dict[str, str] | None = None,
        body: bytes | None = None,
    ) -> bytes:
        """One request: the body of a 2xx answer; raises ``HTTPError`` or ``ConnectionFailed``."""
        url = f"http://{self.address}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        return self.fetch(url, address=self.address, timeout=self.timeout, method=method,
                          body=body)  # fmt: skip

    @staticmethod
    def fetch(
        url: str,
        *,
        address: str,
        timeout: float,
        method: str = "GET",
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> bytes:
        """One request to ``url`` (errors name ``address``): the body of a 2xx answer; raises
        ``HTTPError`` (with the daemon's ``{"message"}``) or ``ConnectionFailed``."""
        req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as response:
                data: bytes = response.read()
                return data
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                message = str(json.loads(raw)["message"])
            except (ValueError, KeyError, TypeError):
                message = raw.decode("utf-8", "replace").strip() or str(exc.reason)
            raise HTTPError(address, exc.code, message) from None
        except urllib.error.URLError as exc:
            raise ConnectionFailed(address, f"HTTP API unreachable ({exc.reason})") from None
        except (TimeoutError, OSError) as exc:
            raise ConnectionFailed(address, f"HTTP API unreachable ({exc})") from None
        except http.client.HTTPException as exc:
            # Something answered, but not in HTTP: the daemon's TCP port, or not lmqd at all.
            raise ConnectionFailed(
                address, f"not an HTTP API ({type(exc).__name__}: {exc!s:.60}); is it the TCP port?"
            ) from None

    def ping(self) -> str:
        """``/ping``: ``"OK"`` when healthy."""
        return self.request("GET", "/ping").decode("utf-8", "replace")

    def info(self) -> dict[str, Any]:
        """``/info`` as a dict (version, ports, ...)."""
        return self._json(self.request("GET", "/info"))

    def stats(
        self, topic: str | None = None, channel: str | None = None, *, include_clients: bool = False
    ) -> dict[str, Any]:
        """``/stats?format=json`` as a dict (nsq-reference.md §2.4 shape)."""
        params = {"format": "json", "include_clients": "true" if include_clients else "false"}
        if topic is not None:
            params["topic"] = topic
        if channel is not None:
            params["channel"] = channel
        data = self._json(self.request("GET", "/stats", params))
        # nsqd 0.x wrapped every answer in {"status_code", "status_txt", "data"}.
        if "data" in data and "topics" not in data and isinstance(data["data"], dict):
            inner: dict[str, Any] = data["data"]
            return inner
        return data

    def topic_action(self, action: str, topic: str) -> None:
        """POST ``/topic/<action>``: create, delete, empty, pause or unpause."""
        self.request("POST", f"/topic/{action}", {"topic": topic})

    def channel_action(self, action: str, topic: str, channel: str) -> None:
        """POST ``/channel/<action>``: create, delete, empty, pause or unpause."""
        self.request("POST", f"/channel/{action}", {"topic": topic, "channel": channel})

    def pub(self, topic: str, body: bytes, *, defer_ms: int | None = None) -> None:
        """POST ``/pub``."""
        params = {"topic": topic}
        if defer_ms is not None:
            params["defer"] = str(defer_ms)
        self.request("POST", "/pub", params, body)

    def _json(self, data: bytes) -> dict[str, Any]:
        try:
            result = json.loads(data)
        except ValueError:
            # lmqd's API answers JSON here: whatever answered is something else.
            raise ConnectionFailed(
                self.address, "not an lmqd HTTP API (the answer is not JSON)"
            ) from None
        if not isinstance(result, dict):
            raise LmqClientError(f"{self.address}: HTTP API answered with unexpected JSON")
        return result
