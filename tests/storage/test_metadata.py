"""The daemon metadata file (lmqd.dat) and the data-directory lock."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lmqd import __version__
from lmqd.storage import (
    ChannelMetadata,
    DataDirLock,
    DataDirLocked,
    Metadata,
    TopicMetadata,
    load_metadata,
    metadata_path,
    save_metadata,
)
from lmqd.storage.metadata import MetadataEncoder, encode_metadata

SAMPLE = Metadata(
    (
        TopicMetadata("orders", False, (ChannelMetadata("archive"), ChannelMetadata("bill", True))),
        TopicMetadata("Clicks.v2", True, ()),
    )
)


def test_round_trip_in_nsqd_shape(tmp_path: Path) -> None:
    path = metadata_path(tmp_path)
    assert path == str(tmp_path / "lmqd.dat")
    save_metadata(path, SAMPLE)
    assert load_metadata(path) == SAMPLE
    assert json.loads(Path(path).read_bytes()) == {
        "topics": [
            {
                "name": "orders",
                "paused": False,
                "channels": [
                    {"name": "archive", "paused": False},
                    {"name": "bill", "paused": True},
                ],
            },
            {"name": "Clicks.v2", "paused": True, "channels": []},
        ],
        "version": __version__,
    }
    assert sorted(os.listdir(tmp_path)) == ["lmqd.dat"]  # no temp file left behind


def test_channel_policies_round_trip_and_bad_values_are_skipped(tmp_path: Path) -> None:
    path = metadata_path(tmp_path)
    policy = (("backoff_jitter", 0.2), ("dead_letter_topic", "dead"), ("max_attempts", 5))
    saved = Metadata(
        (TopicMetadata("t", False, (ChannelMetadata("c", False, policy), ChannelMetadata("d"))),)
    )
    save_metadata(path, saved)
    assert load_metadata(path) == saved
    channels = json.loads(Path(path).read_bytes())["topics"][0]["channels"]
    assert channels == [
        {"name": "c", "paused": False,
         "policy": {"backoff_jitter": 0.2, "dead_letter_topic": "dead", "max_attempts": 5}},
        {"name": "d", "paused": False},  # no policy: nsqd's shape
    ]  # fmt: skip
    # Values of a JSON type no policy key takes are skipped; the rest of the file loads (the
    # engine's validator judges keys and ranges when the channel is restored).
    Path(path).write_text(
        '{"topics":[{"name":"t","channels":[{"name":"c","policy":{"max_attempts":3,'
        '"backoff_ms":null,"dead_letter_topic":["x"],"backoff_jitter":true}},'
        '{"name":"d","policy":[1]}]}]}'
    )
    assert load_metadata(path).topics[0].channels == (
        ChannelMetadata("c", False, (("max_attempts", 3),)),
        ChannelMetadata("d"),
    )


def test_reads_nsqd_written_files(tmp_path: Path) -> None:
    path = tmp_path / "lmqd.dat"
    path.write_text(
        '{"topics":[{"name":"t","paused":false,"channels":null},'
        '{"name":"u","paused":true,"channels":[{"name":"c","paused":false}]}],'
        '"version":"1.3.0"}'
    )
    assert load_metadata(path) == Metadata(
        (
            TopicMetadata("t", False, ()),
            TopicMetadata("u", True, (ChannelMetadata("c", False),)),
        ),
        "1.3.0",
    )


def test_ephemeral_and_invalid_names_are_never_written(tmp_path: Path) -> None:
    path = tmp_path / "lmqd.dat"
    save_metadata(
        path,
        Metadata(
            (
                TopicMetadata(
                    "keep", False, (ChannelMetadata("tail#ephemeral"), ChannelMetadata("c"))
                ),
                TopicMetadata("gone#ephemeral", False, (ChannelMetadata("c"),)),
                TopicMetadata("test#tmp"),
                TopicMetadata("bad name"),
            )
        ),
    )
    assert load_metadata(path) == Metadata((TopicMetadata("keep", False, (ChannelMetadata("c"),)),))


def test_invalid_entries_in_a_file_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "lmqd.dat"
    path.write_text(
        json.dumps(
            {
                "topics": [
                    {"name": "x" * 65, "paused": False, "channels": []},
                    {"name": "e#ephemeral", "paused": False, "channels": []},
                    {"name": "ok", "paused": False, "channels": [{"name": "c:d", "paused": 1}]},
                ],
                "version": "0.1.0",
            }
        )
    )
    assert load_metadata(path) == Metadata((TopicMetadata("ok"),))


def test_missing_file_is_empty_metadata(tmp_path: Path) -> None:
    assert load_metadata(tmp_path / "lmqd.dat") == Metadata()


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b'{"topics":[{"name":"t"',  # torn
        b"\x00\x00\x00",
        b'{"topics":{"name":"t"}}',
        b'{"topics":[42]}',
        b'{"topics":[{"name":"t","channels":"c"}]}',
        b"[1,2]",
    ],
)
def test_damaged_file_is_set_aside_and_the_daemon_starts_empty(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "lmqd.dat"
    path.write_bytes(content)
    assert load_metadata(path) == Metadata()
    assert (tmp_path / "lmqd.dat.bad").read_bytes() == content
    assert not path.exists()
    assert any(r.name == "lmqd.storage" and r.levelname == "ERROR" for r in caplog.records)


def test_a_second_damaged_file_does_not_overwrite_the_first_copy(tmp_path: Path) -> None:
    path = tmp_path / "lmqd.dat"
    path.write_bytes(b"first")
    load_metadata(path)
    path.write_bytes(b"second")
    load_metadata(path)
    assert (tmp_path / "lmqd.dat.bad").read_bytes() == b"first"
    assert (tmp_path / "lmqd.dat.bad.1").read_bytes() == b"second"


def test_save_replaces_atomically_and_fsyncs_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "lmqd.dat"
    save_metadata(path, SAMPLE)
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    old_inode = path.stat().st_ino
    save_metadata(path, Metadata())
    new_inode = path.stat().st_ino
    assert new_inode != old_inode  # a new file renamed over the old one, never rewritten
    assert synced == [new_inode, tmp_path.stat().st_ino]
    assert load_metadata(path) == Metadata()


def test_data_dir_lock_excludes_a_second_daemon(tmp_path: Path) -> None:
    first = DataDirLock(tmp_path)
    first.acquire()
    assert first.locked
    assert (tmp_path / "lmqd.lock").read_text() == f"{os.getpid()}\n"
    with pytest.raises(DataDirLocked, match="in use by another lmqd"), DataDirLock(tmp_path):
        pass
    first.release()
    with DataDirLock(tmp_path) as again:
        assert again.locked
    assert not again.locked


def test_topic_policy_round_trip_with_string_values(tmp_path: Path) -> None:
    path = metadata_path(tmp_path)
    policy = (("dedup_window_ms", 300_000), ("max_depth", 10), ("overflow", "drop_oldest"))
    meta = Metadata((TopicMetadata("t", False, (), policy),))
    save_metadata(path, meta)
    assert json.loads(Path(path).read_bytes())["topics"][0]["policy"] == {
        "dedup_window_ms": 300_000, "max_depth": 10, "overflow": "drop_oldest",
    }  # fmt: skip
    assert load_metadata(path) == meta
    # Values of another type are skipped one by one (the engine validates the rest).
    doc = {"topics": [{"name": "t", "channels": [],
                       "policy": {"max_depth": -1, "overflow": "reject", "x": [1], "y": None}}]}
    Path(path).write_text(json.dumps(doc))
    assert load_metadata(path).topics[0].policy == (("overflow", "reject"),)


def test_the_encoder_reuses_unchanged_topics_and_writes_what_json_dumps_would() -> None:
    encoder = MetadataEncoder()
    assert encoder.encode(SAMPLE) == encode_metadata(SAMPLE)
    orders, clicks = SAMPLE.topics
    changed = Metadata(
        (
            TopicMetadata("orders", True, orders.channels, (("retention_ms", 5),)),
            clicks,
            TopicMetadata("tmp#ephemeral", False, ()),  # never written, as without an encoder
            TopicMetadata("new", False, (ChannelMetadata("c#ephemeral"), ChannelMetadata("d"))),
        )
    )
    data = encoder.encode(changed)
    assert data == encode_metadata(changed)
    doc = json.loads(data)
    assert data == json.dumps(doc, separators=(",", ":")).encode() + b"\n"
    assert [t["name"] for t in doc["topics"]] == ["orders", "Clicks.v2", "new"]
    assert doc["topics"][0] == {
        "name": "orders",
        "paused": True,
        "channels": [{"name": "archive", "paused": False}, {"name": "bill", "paused": True}],
        "policy": {"retention_ms": 5},
    }
    assert doc["topics"][2]["channels"] == [{"name": "d", "paused": False}]
    assert encoder.encode(Metadata()) == encode_metadata(Metadata())
