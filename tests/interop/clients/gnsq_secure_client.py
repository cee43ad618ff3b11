"""gnsq's socket upgrades against an lmqd, as gnsq's own ``test_socket_upgrades`` does them.

``python gnsq_secure_client.py upgrades '<json>'``: one ``gnsq.NsqdTCPClient`` with the given
``tls``/``deflate``/``snappy`` flags connects, IDENTIFYs (gnsq then upgrades its own socket:
gevent's ``SSLSocket``, gnsq's ``DefalteSocket``/``SnappySocket``), publishes, subscribes and
reads the message back; the result says what gnsq saw at each step. gnsq's ``tls_options`` are
its test suite's: the server's own certificate and key presented as the client's, no
verification (``CERT_NONE``), ``PROTOCOL_TLSv1_2``.
"""

from __future__ import annotations

from typing import Any

import gnsq  # type: ignore[import-untyped]
from clientlib import Params, Result, main
from gnsq import errors
from gnsq import protocol as nsq_protocol
from gnsq.stream.stream import DefalteSocket, SnappySocket, SSLSocket  # type: ignore[import-untyped]


def upgrades(params: Params) -> Result:
    host, _, port = params["address"].rpartition(":")
    options: dict[str, Any] = {
        "address": host,
        "port": int(port),
        "deflate": params["deflate"],
        "snappy": params["snappy"],
    }
    if params["tls"]:
        options["tls_v1"] = True
        options["tls_options"] = {"keyfile": params["tls_key"], "certfile": params["tls_cert"]}
    conn = gnsq.NsqdTCPClient(**options)
    conn.connect()
    result: Result = {"state_after_connect": conn.state}
    try:
        response = conn.identify()
    except errors.NSQErrorCode as exc:
        result["identify_error"] = {"class": type(exc).__name__, "message": str(exc)}
        return result
    result["identify"] = {k: response[k] for k in ("tls_v1", "deflate", "snappy")}
    sock = conn.stream.socket
    result["socket"] = type(sock).__name__
    result["socket_is"] = {
        "ssl": isinstance(sock, SSLSocket),
        "deflate": isinstance(sock, DefalteSocket),
        "snappy": isinstance(sock, SnappySocket),
        "inner_ssl": isinstance(getattr(sock, "_socket", None), SSLSocket),
    }
    conn.publish(params["topic"], b"sup")
    result["publish"] = list(_frame(conn))
    conn.subscribe(params["topic"], "channel")
    result["subscribe"] = list(_frame(conn))
    conn.ready(1)
    frame, message = conn.read_response()
    result["message"] = [frame, message.body.decode() if frame == 2 else repr(message)]
    conn.close_stream()
    return result


def _frame(conn: Any) -> tuple[int, str]:
    frame, data = conn.read_response()
    if frame == nsq_protocol.FRAME_TYPE_ERROR:
        return frame, repr(data)
    return frame, data.decode()


if __name__ == "__main__":
    main({"upgrades": upgrades})
