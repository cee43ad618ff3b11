"""Small helpers shared by the async and blocking clients: addresses, names, IDENTIFY."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Sequence
from typing import Any

from lmq_client.core.link import RECEIVE_SIZE
from lmq_client.errors import InvalidNameError
from lmq_client.extension import IDENTIFY_FIELDS as EXTENSION_FIELDS
from lmqd import __version__
from lmqd.names import valid_name
from lmqd.net import split_address

USER_AGENT = f"lmq_client/{__version__}"

_buffers = threading.local()


def receive_buffer() -> memoryview:
    """This thread's buffer of ``RECEIVE_SIZE`` bytes to receive into: ``sock.recv(256 KiB)``
    allocates (mmap) and frees (munmap) 256 KiB for every read, a 10-byte ``OK`` included,
    three syscalls a publish more than a ``recv_into`` this buffer. Whoever reads into it copies
    the bytes out before the thread's next read (one event loop per thread, one blocking read
    at a time)."""
    buffer: memoryview | None = getattr(_buffers, "buffer", None)
    if buffer is None:
        buffer = _buffers.buffer = memoryview(bytearray(RECEIVE_SIZE))
    return buffer


def address_list(addresses: str | Sequence[str]) -> list[str]:
    """One address or many, validated, as a non-empty list."""
    result = [addresses] if isinstance(addresses, str) else list(addresses)
    if not result:
        raise ValueError("no daemon address given")
    for address in result:
        split_address(address)
    return result


def check_name(kind: str, name: str) -> None:
    """Raise ``InvalidNameError`` unless ``name`` is a valid topic/channel name."""
    if not valid_name(name):
        raise InvalidNameError(
            f"invalid {kind} name {name!r}: 1-64 characters of [.a-zA-Z0-9_-], "
            "optionally ending in #ephemeral"
        )


def identify_body(
    *,
    heartbeat_interval: float,
    msg_timeout: float | None = None,
    client_id: str | None = None,
    user_agent: str = USER_AGENT,
    output_buffer_timeout: float | None = None,
) -> dict[str, Any]:
    """The IDENTIFY document every lmq client sends: nsqd's keys, and lmq's extension (a key
    nsqd ignores: ``lmq_client.extension``)."""
    hostname = socket.gethostname()
    body: dict[str, Any] = {
        "client_id": client_id or hostname.split(".")[0],
        "hostname": hostname,
        "user_agent": user_agent,
        "feature_negotiation": True,
        "heartbeat_interval": round(heartbeat_interval * 1000),
        **EXTENSION_FIELDS,
    }
    if msg_timeout is not None:
        body["msg_timeout"] = round(msg_timeout * 1000)
    if output_buffer_timeout is not None:
        body["output_buffer_timeout"] = round(output_buffer_timeout * 1000)
    return body


def parse_identify_response(data: bytes) -> dict[str, Any]:
    """IDENTIFY's answer: the JSON document, or {} for a plain ``OK`` (old daemons)."""
    if data == b"OK":
        return {}
    try:
        result = json.loads(data)
    except ValueError:
        return {}
    return result if isinstance(result, dict) else {}
