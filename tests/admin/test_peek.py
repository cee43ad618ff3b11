"""``lmqadmin peek`` against a real lmqd subprocess: the table, ``--json``, and its errors."""

from __future__ import annotations

import json

from click.testing import CliRunner

from lmq_client.admin.cli import cli
from lmq_client.http import HTTPClient
from tests.support.process import LmqdProcess

from .test_cli import run


def test_peek_shows_a_topics_backlog_as_a_table_and_as_json(
    lmqd_module_server: LmqdProcess,
) -> None:
    server = lmqd_module_server
    assert server.http_address is not None
    client = HTTPClient(server.http_address)
    for body in (b"first", b"\xff\x00"):
        client.pub("peeked", body)
    result = run(server, "peek", "peeked")
    assert result.exit_code == 0, result.output
    assert f"peeked queued on {server.http_address} (2 shown)" in result.output
    assert "first" in result.output and "base64:/wA=" in result.output
    result = run(server, "--json", "peek", "peeked", "-n", "1")
    doc = json.loads(result.output)[server.http_address]
    assert (doc["count"], doc["messages"][0]["body"]) == (1, "first")
    assert client.stats("peeked")["topics"][0]["depth"] == 2  # nothing consumed


def test_peek_errors(lmqd_module_server: LmqdProcess) -> None:
    server = lmqd_module_server
    assert run(server, "peek", "peeked2", "--state", "in_flight").exit_code == 2  # no channel
    assert run(server, "peek", "bad!").exit_code == 2
    result = run(server, "peek", "never-created")
    assert result.exit_code != 0 and result.output.count("\n") == 1


def test_pub_sets_lmq_fields_that_peek_shows(lmqd_module_server: LmqdProcess) -> None:
    server = lmqd_module_server
    result = run(server, "pub", "withfields", "hello", "--header", "source=cli",
                 "--header", "env=test", "--priority", "5", "--ttl", "10m")  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(run(server, "--json", "peek", "withfields").output)[server.http_address]
    [message] = doc["messages"]
    assert (message["body"], message["priority"]) == ("hello", 5)
    assert message["headers"] == {"source": "cli", "env": "test"}
    for bad in (["--header", "novalue"], ["--priority", "10"], ["--ttl", "soon"]):
        assert run(server, "pub", "withfields", "x", *bad).exit_code == 2, bad


def test_peek_at_80_columns_keeps_ids_and_headers_whole(lmqd_module_server: LmqdProcess) -> None:
    server = lmqd_module_server
    body = '{"order": 1234, "total": 99.5, "items": [1, 2, 3], "note": "leave at the door"}'
    result = run(server, "pub", "narrow", body, "--header", "source=checkout-service",
                 "--header", "trace=4bf92f3577b34da6")  # fmt: skip
    assert result.exit_code == 0, result.output
    [message] = json.loads(run(server, "--json", "peek", "narrow").output)[
        server.http_address
    ]["messages"]
    assert server.http_address is not None
    env = {"LMQ_HTTP_ADDRESS": server.http_address, "COLUMNS": "80"}
    result = CliRunner().invoke(cli, ["peek", "narrow"], env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(map(len, lines)) <= 80, result.output
    header_row = next(line for line in lines if "id" in line.split())
    # Columns with nothing to say for these messages take no room.
    assert [w for w in header_row.split() if w.isalpha()] == ["offset", "id", "headers", "body"]
    text = result.output
    assert message["id"] in text  # whole, not "0a1b2c3…"
    assert "source=checkout-service" in text and "trace=4bf92f3577b34da6" in text
    assert '{"order": 1234, "tot' in text and "…" in text  # the body is what gets cut
