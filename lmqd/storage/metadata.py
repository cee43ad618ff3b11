"""The daemon metadata file ``<data-path>/lmqd.dat`` and the data directory lock.

The file lists the durable topics and channels and their paused flags, in nsqd's ``nsqd.dat``
JSON shape so that the same tools can read it::

    {"topics":[{"name":"t","paused":false,"channels":[{"name":"c","paused":false}]}],
     "version":"0.1.0"}

A topic with a policy of its own (lmq) also has ``"policy": {"retention_ms": 86400000}``, a key
nsqd ignores (values are integers, and strings for keys such as ``"overflow": "drop_oldest"``);
so has a channel with one (``"policy": {"max_attempts": 5, "dead_letter_topic":
"orders.dead", "backoff_jitter": 0.2}``: integers, numbers and strings).

It is replaced atomically (temp -> fsync -> rename -> fsync the directory). Ephemeral names
(``#ephemeral``, ``#tmp``) are never written. A damaged file does not stop the daemon: it is
moved aside to ``lmqd.dat.bad`` (``.bad.1``... if that exists) and the daemon starts with no
topics; the queues' own files are untouched, so recreating a topic finds its messages again.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
from typing import Any

import attrs

from lmqd import __version__
from lmqd.names import is_ephemeral, valid_name
from lmqd.storage.files import free_aside_path, fsync_dir, write_file_durably

log = logging.getLogger("lmqd.storage")

METADATA_FILENAME = "lmqd.dat"
LOCK_FILENAME = "lmqd.lock"


def is_durable_name(name: str) -> bool:
    """A valid topic or channel name that is stored (not ephemeral)."""
    return valid_name(name) and not is_ephemeral(name)


PolicyPairs = tuple[tuple[str, int | float | str], ...]
"""A channel's own policy keys, sorted (``lmqd.engine.channel_policy`` checks them)."""


@attrs.frozen
class ChannelMetadata:
    """One durable channel."""

    name: str
    paused: bool = False
    policy: PolicyPairs = ()
    """lmq: the channel's own policy keys, sorted; written only when set."""


@attrs.frozen(cache_hash=True)
class TopicMetadata:
    """One durable topic and its durable channels."""

    name: str
    paused: bool = False
    channels: tuple[ChannelMetadata, ...] = ()
    policy: tuple[tuple[str, int | str], ...] = ()
    """lmq: the topic's own policy keys (``lmqd.engine.policy``), sorted; written only when
    set, so a file without policies keeps nsqd's shape."""


@attrs.frozen
class Metadata:
    """Everything in the metadata file."""

    topics: tuple[TopicMetadata, ...] = ()
    version: str = __version__


def metadata_path(data_path: str | os.PathLike[str]) -> str:
    """Where the metadata file of the data directory ``data_path`` lives."""
    return os.path.join(os.fspath(data_path), METADATA_FILENAME)


def encode_metadata(metadata: Metadata, encoder: MetadataEncoder | None = None) -> bytes:
    """The file content: ephemeral and invalid names are left out (and logged). ``encoder``
    reuses the JSON of the topics whose entry has not changed since its last call."""
    return (encoder or MetadataEncoder()).encode(metadata)


class MetadataEncoder:
    """Encodes the metadata file, reusing each unchanged topic's JSON from the previous call.

    A daemon with 10,000 topics spent ~100 ms (on a 2-core VM) in ``json.dumps`` per metadata
    write, holding the GIL: a flood of topic creations, one write per sync round, stalled the
    event loop that long each round. The engine hands the same ``TopicMetadata`` object for a
    topic that did not change (``Topic.metadata_entry``), so its text is found by one lookup
    (the class caches its hash). Only the current topics are kept: the cache is bounded by the
    metadata itself. One encoder per daemon, used by one thread at a time (the syncer's rounds
    are sequential). The output is byte for byte what one ``json.dumps`` of the document gives.
    """

    def __init__(self) -> None:
        self._texts: dict[TopicMetadata, str] = {}

    def encode(self, metadata: Metadata) -> bytes:
        previous = self._texts
        texts: dict[TopicMetadata, str] = {}
        for topic in metadata.topics:
            text = previous.get(topic)
            if text is None:
                text = _encode_topic(topic)
            texts[topic] = text
        self._texts = texts
        version = json.dumps(metadata.version)
        body = ",".join(t for t in texts.values() if t)
        return f'{{"topics":[{body}],"version":{version}}}\n'.encode()


def _encode_topic(topic: TopicMetadata) -> str:
    """One topic's JSON object ("" if it is not stored)."""
    if not _storable(topic.name, "topic"):
        return ""
    channels = []
    for c in topic.channels:
        if not _storable(c.name, f"channel of {topic.name}"):
            continue
        channel: dict[str, Any] = {"name": c.name, "paused": c.paused}
        if c.policy:
            channel["policy"] = dict(c.policy)
        channels.append(channel)
    entry: dict[str, Any] = {"name": topic.name, "paused": topic.paused, "channels": channels}
    if topic.policy:
        entry["policy"] = dict(topic.policy)
    return json.dumps(entry, separators=(",", ":"))


def _storable(name: str, what: str) -> bool:
    if is_durable_name(name):
        return True
    if is_ephemeral(name):
        log.debug("METADATA: not storing ephemeral %s %s", what, name)
    else:
        log.error("METADATA: not storing %s with invalid name %r", what, name)
    return False


def save_metadata(
    path: str | os.PathLike[str], metadata: Metadata, encoder: MetadataEncoder | None = None
) -> None:
    """Write the metadata file atomically and durably (blocking). Raises ``OSError``."""
    path = os.fspath(path)
    write_file_durably(path, encode_metadata(metadata, encoder))
    fsync_dir(os.path.dirname(path) or ".")


def _parse_channel(raw: Any, topic: str) -> ChannelMetadata | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise ValueError(f"bad channel entry in topic {topic!r}")
    name = raw["name"]
    if not is_durable_name(name):
        log.warning("METADATA: skipping channel %r of topic %s (not a durable name)", name, topic)
        return None
    return ChannelMetadata(
        name, raw.get("paused") is True, _parse_channel_policy(raw.get("policy"), topic, name)
    )


def _parse_channel_policy(raw: Any, topic: str, channel: str) -> PolicyPairs:
    """A channel's policy keys: a JSON object of integers, numbers and strings (the engine
    checks keys and ranges); anything else is skipped (logged), the rest of the file loads."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        log.warning(
            "METADATA: skipping the policy of channel %s:%s (not an object)", topic, channel
        )
        return ()
    pairs: list[tuple[str, int | float | str]] = []
    for key, value in raw.items():
        if isinstance(key, str) and type(value) in (int, float, str):
            pairs.append((key, value))
        else:
            log.warning("METADATA: skipping policy key %r of channel %s:%s", key, topic, channel)
    return tuple(sorted(pairs))


def _parse_topic(raw: Any) -> TopicMetadata | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise ValueError("bad topic entry")
    name = raw["name"]
    if not is_durable_name(name):
        log.warning("METADATA: skipping topic %r (not a durable name)", name)
        return None
    raw_channels = raw.get("channels")
    if raw_channels is None:  # nsqd writes null for a topic without channels
        raw_channels = []
    if not isinstance(raw_channels, list):
        raise ValueError(f"bad channel list in topic {name!r}")
    channels = []
    for raw_channel in raw_channels:
        channel = _parse_channel(raw_channel, name)
        if channel is not None:
            channels.append(channel)
    return TopicMetadata(
        name, raw.get("paused") is True, tuple(channels), _parse_policy(raw.get("policy"), name)
    )


def _parse_policy(raw: Any, topic: str) -> tuple[tuple[str, int | str], ...]:
    """A topic's policy keys: a JSON object of non-negative integers and strings (the engine
    checks the keys and values); anything else is skipped (logged), the rest of the file still
    loads."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        log.warning("METADATA: skipping the policy of topic %s (not an object)", topic)
        return ()
    pairs: list[tuple[str, int | str]] = []
    for key, value in raw.items():
        if isinstance(key, str) and ((type(value) is int and value >= 0) or type(value) is str):
            pairs.append((key, value))
        else:
            log.warning("METADATA: skipping policy key %r of topic %s", key, topic)
    return tuple(sorted(pairs))


def decode_metadata(data: bytes) -> Metadata:
    """Parse the file content; raises ``ValueError`` if it is not metadata at all.

    Single entries with names that are invalid or ephemeral are skipped (logged), as nsqd does.
    """
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("topics", []), list):
        raise ValueError("not a metadata object")
    version = doc.get("version", "")
    topics = []
    for raw in doc.get("topics") or []:
        topic = _parse_topic(raw)
        if topic is not None:
            topics.append(topic)
    return Metadata(tuple(topics), version if isinstance(version, str) else "")


def load_metadata(path: str | os.PathLike[str]) -> Metadata:
    """Read the metadata file; a missing one is empty metadata, a damaged one is set aside.

    Never raises for bad content: the damaged file is renamed to ``<path>.bad`` (or a free
    ``.bad.N``), the problem is logged, and empty metadata is returned.
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return Metadata()
    try:
        return decode_metadata(data)
    except ValueError as exc:
        aside = free_aside_path(path + ".bad")
        try:
            os.rename(path, aside)
        except OSError:
            log.error("METADATA: could not move damaged %s aside", path, exc_info=True)
            aside = "(not moved)"
        log.error(
            "METADATA: %s is damaged (%s); kept as %s, starting with no topics", path, exc, aside
        )
        return Metadata()


class DataDirLocked(RuntimeError):
    """Another process holds the data directory."""


class DataDirLock:
    """An exclusive ``flock`` on ``<data-path>/lmqd.lock`` for as long as the daemon runs.

    Two daemons sharing one data path would interleave writes to the same segment files; the
    second one fails to start instead. The lock dies with the process (no stale lock after
    kill -9), and the file, which holds the owner's pid for operators, is never removed.
    """

    def __init__(self, data_path: str | os.PathLike[str]) -> None:
        self.path = os.path.join(os.fspath(data_path), LOCK_FILENAME)
        self._fd = -1

    def acquire(self) -> None:
        """Take the lock or raise ``DataDirLocked``."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise DataDirLocked(
                    f"data path {os.path.dirname(self.path)} is in use by another lmqd "
                    f"(lock file {self.path})"
                ) from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Give the lock up (closing the descriptor releases the flock)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    @property
    def locked(self) -> bool:
        return self._fd >= 0

    def __enter__(self) -> DataDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()
