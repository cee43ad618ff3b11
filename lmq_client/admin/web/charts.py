"""The charts' data: ``GET /charts/data?topic=T[&channel=C]``, a topic's or channel's last hour
from the sampler's ``History`` as JSON columns (``t``: seconds since the epoch, then one list
per metric), which ``static/console.js`` draws with uPlot. It reads memory only: any number of
open charts adds no load on the daemons. ``GET /debug/vars``: the console's own counters."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from lmq_client.admin.web.asgi import Request, Response

if TYPE_CHECKING:
    from lmq_client.admin.web.app import Console

__all__ = ["register"]


def register(console: Console) -> None:
    @console.route("GET", "/charts/data")
    async def chart_data(request: Request) -> Response:
        topic = console.name("topic", request.query.get("topic", ""))
        channel = request.query.get("channel", "")
        if channel:
            console.name("channel", channel)
        data = console.sampler.history.read((topic, channel))
        return Response(json.dumps(data, separators=(",", ":")).encode(),
                        content_type="application/json")

    @console.route("GET", "/debug/vars")
    async def debug_vars(request: Request) -> Response:
        """The console's own counters: sampling rounds, the last one's time and length, and
        the requests it has made to daemons and lookupds (the benchmark reads them)."""
        sampler = console.sampler
        data = {
            "rounds": sampler.rounds, "sampled_at": sampler.latest.at,
            "last_round_s": sampler.last_round_s, "upstream_requests": console.upstream.requests,
            "nodes": len(sampler.latest.nodes), "topics": len(sampler.latest.topics),
            "history_series": len(sampler.history),
        }  # fmt: skip
        return Response(json.dumps(data).encode(), content_type="application/json")
