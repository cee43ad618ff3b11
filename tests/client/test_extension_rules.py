"""lmq_client's per-message fields, as units: what is refused before sending, and the daemon's
IDENTIFY answer deciding whether XPUB may be used."""

from __future__ import annotations

import pytest

from lmq_client.errors import LmqClientError
from lmq_client.extension import message_ext, negotiated, require_extension, xpub_command
from lmq_client.sync import Producer
from lmqd.message_ext import MessageExt
from lmqd.protocol.extension import XpubMessage, parse_xpub_body


def test_fields_become_one_extension() -> None:
    assert message_ext() is None
    assert message_ext(headers={"a": "b"}, priority=2, ttl=1.5, dedup_id="x") == MessageExt(
        2, 1500, b"x", (("a", "b"),)
    )
    for bad, match in (
        ({"priority": 10}, "priority"),
        ({"ttl": 0.0004}, "ttl"),
        ({"dedup_id": ""}, "empty"),
        ({"headers": {"": "v"}}, "header key"),
    ):
        with pytest.raises(ValueError, match=match):
            message_ext(**bad)  # type: ignore[arg-type]


def test_xpub_gives_each_message_its_own_dedup_id() -> None:
    command = xpub_command("t", [b"a", b"b"], MessageExt(priority=4), dedup_ids=["1", b"2"])
    body = command.partition(b"\n")[2][4:]
    messages = parse_xpub_body(body, max_msg_size=1024)
    assert [(m.body, m.ext.priority, m.ext.dedup_id) for m in messages] == [
        (b"a", 4, b"1"), (b"b", 4, b"2"),
    ]  # fmt: skip


def test_only_a_daemon_that_accepted_the_extension_gets_xpub() -> None:
    assert negotiated({"lmq_ext": 1})
    for answer in ({}, {"lmq_ext": 0}, {"lmq_ext": "1"}):  # nsqd; refused; nonsense
        assert not negotiated(answer)
        with pytest.raises(LmqClientError, match="does not support lmq's message extension"):
            require_extension(answer, "127.0.0.1:4150")


def test_blocking_xpub_refuses_bad_messages_before_connecting() -> None:
    # Nothing listens on port 1: a refusal before sending cannot be a connection error.
    producer = Producer("127.0.0.1:1")
    with pytest.raises(ValueError, match="xpub needs at least one message"):
        producer.xpub("t", [])
    with pytest.raises(ValueError, match="priority 10 out of range"):
        producer.xpub("t", [XpubMessage(b"x", MessageExt(priority=10))])
    with pytest.raises(ValueError, match="topic"):
        producer.xpub("bad name", [XpubMessage(b"x", MessageExt())])
