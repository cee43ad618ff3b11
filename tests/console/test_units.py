"""The console's pure parts, without a daemon or a browser: the snapshot's aggregations and
rates, the charts' history, body views and the filter, the publish form's headers, the policy
editor's error-to-field rule, and the config's base path.

Rules for this module: plain data in, plain data out; no I/O, no clock (times are passed in).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from lmq_client.admin.web.bodies import BodyFilter, render_body
from lmq_client.admin.web.browse import page_step
from lmq_client.admin.web.config import ConsoleConfig
from lmq_client.admin.web.history import METRICS, History
from lmq_client.admin.web.model import Node, Snapshot, rates_between
from lmq_client.admin.web.policy import CHANNEL_KEYS, TOPIC_KEYS, field_of
from lmq_client.admin.web.publish import parse_headers


def channel(name: str, **counts: Any) -> dict[str, Any]:
    return {"channel_name": name, "depth": 0, "backend_depth": 0, "in_flight_count": 0,
            "deferred_count": 0, "message_count": 0, "requeue_count": 0, "timeout_count": 0,
            "client_count": 0, "clients": [], "paused": False,
            "e2e_processing_latency": {"count": 0, "percentiles": None}, **counts}  # fmt: skip


def node(address: str, *topics: dict[str, Any]) -> Node:
    return Node(http_address=address, stats={"topics": list(topics)})


def topic(name: str, *channels: dict[str, Any], **counts: Any) -> dict[str, Any]:
    return {"topic_name": name, "channels": list(channels), "depth": 0, "backend_depth": 0,
            "message_count": 0, "paused": False,
            "e2e_processing_latency": {"count": 0, "percentiles": None}, **counts}  # fmt: skip


def test_a_topic_is_the_sum_of_its_nodes_and_e2e_is_their_mean() -> None:
    p99 = {"count": 5, "percentiles": [{"quantile": 0.99, "value": 2_000_000}]}
    p99b = {"count": 5, "percentiles": [{"quantile": 0.99, "value": 4_000_000}]}
    snapshot = Snapshot(at=10.0, nodes=(
        node("a:1", topic("t", channel("c", depth=3, in_flight_count=1, message_count=9,
                                       e2e_processing_latency=p99),
                          depth=2, backend_depth=1, message_count=9, paused=True)),
        node("b:1", topic("t", channel("c", depth=4, message_count=5,
                                       e2e_processing_latency=p99b), message_count=5)),
    ))  # fmt: skip
    row = snapshot.topics["t"]
    assert (row.total.depth, row.total.memory_depth, row.total.backend_depth) == (2, 1, 1)
    assert row.total.messages == 14 and row.total.paused and row.total.in_flight == 1
    [c] = row.channels
    assert c.total.depth == 7 and c.total.e2e == [(0.99, 3_000_000)]
    assert [n.http_address for n, _ in c.nodes] == ["a:1", "b:1"]
    assert snapshot.total_messages == 14


def test_rates_are_the_change_of_message_count_over_time() -> None:
    before = Snapshot(at=10.0, nodes=(node("a:1", topic("t", channel("c", message_count=10),
                                                        message_count=10)),))  # fmt: skip
    nodes = (node("a:1", topic("t", channel("c", message_count=30), message_count=40)),)
    rates = rates_between(before, 12.0, nodes)
    assert rates == {("a:1", "t", ""): 15.0, ("a:1", "t", "c"): 10.0}
    # A counter that went back (the topic was deleted and made again) has no rate.
    assert rates_between(before, 12.0, (node("a:1", topic("t", message_count=3)),)) == {}


def test_history_allocates_a_series_at_its_first_non_zero_value_and_wraps() -> None:
    history = History(slots=3)
    idle = Snapshot(at=1.0, nodes=(node("a:1", topic("idle", channel("c"))),))
    history.record(idle)
    assert len(history) == 0  # thousands of idle topics cost nothing
    data = history.read(("idle", "c"))
    assert data["t"] == [1.0] and data["depth"] == [0.0]
    for i, at in enumerate((2.0, 3.0, 4.0, 5.0)):
        counts = channel("c", depth=i + 1, message_count=10 * (i + 1), requeue_count=i)
        busy = Snapshot(at=at, nodes=(node("a:1", topic("t", counts,
                                                        message_count=10 * (i + 1))),))
        history.record(busy)
    data = history.read(("t", "c"))
    assert data["t"] == [3.0, 4.0, 5.0]  # the oldest rounds fell out of the ring
    assert data["depth"] == [2.0, 3.0, 4.0]
    assert data["publish_rate"] == [10.0, 10.0, 10.0]
    assert data["requeue_rate"] == [1.0, 1.0, 1.0]
    # delivered: messages + requeues + timeouts - depth - deferred, per second
    assert data["delivery_rate"] == [10.0, 10.0, 10.0]
    assert history.read(("t", ""))["delivery_rate"] == data["delivery_rate"]
    assert set(data) == {"t", *METRICS}


def test_bodies_are_shown_as_text_json_or_hex() -> None:
    assert render_body(b'{"a": [1]}', "json").text == '{\n  "a": [\n    1\n  ]\n}'
    shown = render_body(b"not json", "json")
    assert shown.text == "not json" and shown.note == "not JSON: shown as text"
    assert render_body(b"\xff<b>", "text").text == "\ufffd<b>"
    dump = render_body(b"AB\x00" * 7, "hex").text.splitlines()
    assert dump[0] == "00000000  41 42 00 41 42 00 41 42 00 41 42 00 41 42 00 41  AB.AB.AB.AB.AB.A"
    assert dump[1].startswith("00000010  42 00 ")


@pytest.mark.parametrize(("flt", "body", "kept"), [
    (BodyFilter(contains="ord"), b"order 1", True),
    (BodyFilter(contains="ord"), b"item", False),
    (BodyFilter(field="user.id=42"), b'{"user": {"id": 42}}', True),
    (BodyFilter(field="user.id=42"), b'{"user": {"id": 7}}', False),
    (BodyFilter(field="items.0.sku=B1"), b'{"items": [{"sku": "B1"}]}', True),
    (BodyFilter(field="user.id=42"), b"not json", False),
    (BodyFilter(contains="x", field="a=true"), b'{"a": true, "x": 1}', True),
])  # fmt: skip
def test_the_browsers_filter(flt: BodyFilter, body: bytes, kept: bool) -> None:
    assert flt.matches(body) is kept


def test_publish_headers_are_name_value_lines() -> None:
    assert parse_headers("Trace-Id: a:b\n\nsource:  web ") == {"trace-id": "a:b", "source": "web"}
    with pytest.raises(ValueError, match="line 2"):
        parse_headers("a: 1\nno colon")


def test_lmqds_policy_errors_name_their_field() -> None:
    topic_keys, channel_keys = list(TOPIC_KEYS), list(CHANNEL_KEYS)
    assert field_of("INVALID_POLICY: ttl_ms must be an integer from 0 to 9", topic_keys) == "ttl_ms"
    assert field_of("INVALID_POLICY: overflow must be one of ...", topic_keys) == "overflow"
    assert field_of("INVALID_POLICY: backoff_jitter must be ...", channel_keys) == "backoff_jitter"
    assert field_of("INVALID_POLICY: body too large", topic_keys) == ""


@pytest.mark.parametrize(("given", "kept"), [("/", ""), ("admin/", "/admin"), ("/a/b/", "/a/b")])
def test_base_path_is_normalised(given: str, kept: str) -> None:
    config = ConsoleConfig(base_path=given, sample_interval_s=5.0)
    assert config.base_path == kept
    assert config.history_slots == 720
    assert not math.isnan(config.sample_interval_s)


@pytest.mark.parametrize(
    ("window", "more", "n", "filtered", "step"),
    [
        ([10, 3], [True, False], 10, False, 10),  # unfiltered: n positions
        ([5, 3], [False, False], 10, False, None),  # nobody has more: the last page
        ([4, 9], [True, True], 4, True, 4),  # filtered: where the first node with more ends
        ([9, 1000], [True, False], 4, True, 9),  # a node with no more does not bound it
    ],
)
def test_the_browsers_next_page_starts_where_no_match_is_lost(
    window: list[int], more: list[bool], n: int, filtered: bool, step: int | None
) -> None:
    assert page_step(window, more, n, filtered) == step
