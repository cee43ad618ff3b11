"""Follower: a mirror's tasks -- the primary's topic list and channel positions once a second,
and a continuous fetch of every topic's new messages -- and its refusal of writes.

Theory of operation
-------------------
Two requests run side by side, each on its own kept-alive connection (``HttpClient``):

* **The topic list** (``GET /mirror/topics``, every ``POLL_S``): the primary's non-ephemeral
  topics, each with its offsets, paused flag, policy and channels (``wire.py``). The first
  answer proves the address is an lmqd that has mirrors and says who it is: a node other than
  the one this mirror followed, or an epoch older than this node's (it was promoted over it),
  is refused (``MirrorRefused``: one line, lmqd exits 1) unless ``--mirror-force``, which drops
  the local copies and follows afresh. Then every topic gets a local topic that does not pump
  (``Topic.following``) and every channel a local channel standing where the primary's reads
  (``lmqd.engine.replica``); topics and channels gone from the primary go here too (a mirror's
  own replay channels, made with ``/channel/create?from=``, stay). The positions are written to
  ``lmqd.mirror.json`` (with what each channel holds unfinished) when they changed, in a worker
  thread, so that a promotion after a restart of the mirror knows them.
* **The fetch** (``POST /mirror/fetch``): for every followed topic, the copy's end and what is
  durable (``acked``), answered with each topic's new messages, or after a long poll of up to
  ``FETCH_WAIT_MS`` when there is none. The messages are stored at their offsets
  (``replica.store_copies``); ``planner.TopicLink`` counts what went missing. A ``--durable``
  mirror acknowledges only what its syncer has fsynced: the primary keeps the rest. When
  publishes wait for it on the primary (``--min-insync-mirrors``, the section's ``waiting``), it
  fsyncs before it fetches again (``_sync_waited``), so that the next fetch acknowledges them.

A failed request (the primary down, a timeout) makes every topic ``disconnected`` and waits
``Backoff``'s delay before the next; the copy goes on from its end when the primary answers
again, so nothing is asked twice and nothing is stored twice. After ``kill -9`` of the mirror its
topics' logs recover to what was written (fsynced, with ``--durable``) and the fetch asks from
there: the primary's hold kept the rest.

**Writes** (``WriteGuard``): publishes to every non-ephemeral topic and admin of followed topics
and channels are refused with the primary's address (``Broker.check_topic_write``); ephemeral
topics and the mirror's own replay channels are its own.
"""

from __future__ import annotations

import json
import logging
import math
import os
import urllib.parse
from collections.abc import Callable
from typing import Any

import trio

from lmqd.broker import Broker
from lmqd.engine.backend import BackendError
from lmqd.engine.channel_policy import parse_update as parse_channel_policy
from lmqd.engine.cursor import READ_ALL
from lmqd.engine.policy import PolicyError, parse_update
from lmqd.engine.replica import (
    advance_copy,
    copy_spans,
    follow_channel,
    follow_pumped,
    keep_unfinished,
    store_copies,
)
from lmqd.engine.topic import Topic
from lmqd.mirror.frames import decode_copies
from lmqd.mirror.planner import Backoff, TopicLink
from lmqd.mirror.role import NodeRole, Peer
from lmqd.mirror.stats import MirrorStats
from lmqd.mirror.wire import TopicFollow, decode_sections
from lmqd.names import is_ephemeral
from lmqd.storage.files import fsync_dir, write_file_durably
from lmqd.transport.http_client import HttpClient, HttpClientError

__all__ = [
    "FETCH_WAIT_MS",
    "POLL_S",
    "STATE_FILENAME",
    "Follower",
    "MirrorRefused",
    "load_followed",
]

log = logging.getLogger("lmqd.mirror")

POLL_S = 1.0
"""How often the topic list and channel positions are asked for: the issue's "at least every
second", and a new topic is followed within it."""
FETCH_WAIT_MS = 1000
"""A fetch with nothing new waits this long at the primary for a message (long poll)."""
STATE_FILENAME = "lmqd.mirror.json"


class MirrorRefused(Exception):
    """This node will not follow the address it was given; ``str()`` is the one line lmqd
    prints before it exits."""


def load_followed(data_path: str) -> tuple[dict[str, TopicFollow], set[tuple[str, str]]]:
    """What the mirror last heard of its primary's topics, and its own replay channels (empty
    if it never followed). A damaged file is logged and ignored: the primary tells it again."""
    path = os.path.join(data_path, STATE_FILENAME)
    try:
        with open(path, "rb") as f:
            doc = json.load(f)
        topics = {str(n): TopicFollow.from_json(t) for n, t in doc["topics"].items()}
        local = {(str(t), str(c)) for t, c in doc.get("local", [])}
    except FileNotFoundError:
        return {}, set()
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.error("MIRROR: %s cannot be read (%s): the primary's positions are asked again",
                  path, exc)  # fmt: skip
        return {}, set()
    return topics, local


def _save_followed(
    data_path: str, topics: dict[str, TopicFollow], local: set[tuple[str, str]]
) -> None:
    doc = {
        "topics": {name: t.to_json() for name, t in sorted(topics.items())},
        "local": sorted([t, c] for t, c in local),
    }
    write_file_durably(os.path.join(data_path, STATE_FILENAME), json.dumps(doc).encode())
    fsync_dir(data_path)


class Follower:
    """A mirror's following of its primary; see the module docstring."""

    def __init__(
        self,
        broker: Broker,
        role: NodeRole,
        *,
        primary: str,
        client: Callable[[], HttpClient],
        save_role: Callable[[NodeRole], None],
        own_address: Callable[[], str],
    ) -> None:
        self.broker = broker
        self.role = role
        self._primary = primary
        self._new_client = client
        self._save_role = save_role
        self._own_address = own_address
        data_path = broker.options.data_path
        self._data_path = data_path
        self.followed, self.local_channels = load_followed(data_path)
        self.links: dict[str, TopicLink] = {name: TopicLink(name) for name in self.followed}
        self.backoff = Backoff()
        self.connected = False
        self.contacted = trio.Event()
        """Set by the first answer of the primary that was accepted."""
        self.last_contact = -math.inf
        self.last_contact_ns = 0
        self.primary_node_id = role.following.node_id if role.following else ""
        self.primary_epoch = role.following.epoch if role.following else 0
        self._topics_changed = trio.Event()
        self._saved: tuple[dict[str, TopicFollow], set[tuple[str, str]]] | None = None
        self._scope = trio.CancelScope()
        self._stopped = trio.Event()

    # -- WriteGuard (``lmqd.broker``) ------------------------------------------------------------

    @property
    def primary(self) -> str:
        return self._primary

    def _reason(self) -> str:
        return f"mirror of {self._primary}: read-only until promoted"

    def refuse_topic(self, topic: str) -> str | None:
        return None if is_ephemeral(topic) else self._reason()

    def refuse_channel(self, topic: str, channel: str) -> str | None:
        if is_ephemeral(topic) or (topic, channel) in self.local_channels:
            return None
        return self._reason()

    def add_local_channel(self, topic: str, channel: str) -> None:
        """A replay channel made on this mirror (``/channel/create?from=``): its own, read
        ahead like an internal channel (the mirror's pump pushes nothing)."""
        self.local_channels.add((topic, channel))
        self._read_all(topic, channel)

    def _read_all(self, topic: str, channel: str) -> None:
        t = self.broker.topic_or_none(topic)
        c = t.channel_or_none(channel) if t is not None else None
        if c is not None and c.cursor is not None:
            c.cursor.replay_until = READ_ALL

    # -- running -------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Follow until cancelled or ``stop``; raises ``MirrorRefused`` (see the module
        docstring)."""
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._poll_topics)
                    nursery.start_soon(self._fetch_loop)
                    task_status.started()
        finally:
            self._stopped.set()

    async def stop(self) -> None:
        """Stop following, and return once the tasks have ended."""
        self._scope.cancel()
        await self._stopped.wait()

    # -- the topic list ------------------------------------------------------------------------

    def _query(self, **extra: str) -> str:
        params = {
            "mirror": self.role.node_id,
            "address": self._own_address(),
            "durable": "true" if self.broker.options.durable else "false",
            **extra,
        }
        return urllib.parse.urlencode(params)

    async def _poll_topics(self) -> None:
        client = self._new_client()
        try:
            while True:
                delay = POLL_S
                try:
                    answer = await client.request("GET", "/mirror/topics?" + self._query())
                except HttpClientError as exc:
                    if not exc.unreachable and not self.contacted.is_set():
                        raise MirrorRefused(
                            f"--mirror-of {self._primary}: not an lmqd HTTP API ({exc})"
                        ) from None
                    delay = self._failed(str(exc))
                else:
                    doc = self._topics_answer(answer.status, answer.body)
                    if doc is None:
                        delay = self._failed(f"HTTP {answer.status} {answer.body[:120]!r}")
                    else:
                        await self._accept(doc)
                        await self._save()
                await trio.sleep(delay)
        finally:
            await client.aclose()

    def _topics_answer(self, status: int, body: bytes) -> dict[str, Any] | None:
        """The topic list, or None for an answer to retry later; raises ``MirrorRefused``
        before the first contact for an answer that is not lmqd's."""
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        is_lmqd = isinstance(doc, dict) and (
            "message" in doc or ("node_id" in doc and "topics" in doc)
        )
        if not is_lmqd:
            if self.contacted.is_set():
                return None
            raise MirrorRefused(
                f"--mirror-of {self._primary}: not an lmqd HTTP API (HTTP {status}, "
                f"{body[:60]!r})"
            )
        assert isinstance(doc, dict)
        if status == 404 and not self.contacted.is_set():
            raise MirrorRefused(
                f"--mirror-of {self._primary}: answers {doc.get('message')} to /mirror/topics: "
                "an nsqd, or an lmqd without mirrors"
            )
        if status != 200:
            return None
        return doc

    async def _accept(self, doc: dict[str, Any]) -> None:
        """A topic list from the primary: check who it is (first), then follow it."""
        try:
            node_id = str(doc["node_id"])
            epoch = int(doc["epoch"])
            topics = {str(n): TopicFollow.from_json(t) for n, t in doc["topics"].items()}
        except (KeyError, TypeError, ValueError) as exc:
            self._failed(f"malformed topic list ({exc})")
            return
        if node_id != self.primary_node_id or epoch != self.primary_epoch:
            await self._check_identity(node_id, epoch)
        self._succeeded()
        self.contacted.set()
        changed = set(topics) != set(self.followed)
        self._follow(topics, trio.current_time())
        if changed:
            self._topics_changed.set()

    async def _check_identity(self, node_id: str, epoch: int) -> None:
        role = self.role
        force = self.broker.options.mirror_force
        refusal = None
        if role.following is not None and role.following.node_id != node_id:
            refusal = (
                f"--mirror-of {self._primary}: node {node_id} is not the primary this mirror "
                f"followed ({role.following.node_id}: its data directory was replaced?)"
            )
        elif role.epoch > epoch:
            took = role.promoted_from
            refusal = (
                f"--mirror-of {self._primary}: this node is at epoch {role.epoch}, the primary "
                f"at {epoch}"
                + (f" (this node was promoted over {took.address})" if took else "")
                + ": following it would drop what this node accepted since"
            )
        if refusal is not None:
            if not force:
                raise MirrorRefused(refusal + "; --mirror-force copies it afresh")
            log.warning("MIRROR: %s; --mirror-force: dropping the local copies", refusal)
            self._drop_local_copies()
        self.primary_node_id = node_id
        self.primary_epoch = epoch
        self.role = NodeRole(role.node_id, epoch, Peer(self._primary, node_id, epoch),
                             role.promoted_from, role.promoted_at)  # fmt: skip
        await trio.to_thread.run_sync(self._save_role, self.role)
        log.info("MIRROR: following %s (node %s, epoch %d)", self._primary, node_id, epoch)

    def _drop_local_copies(self) -> None:
        broker = self.broker
        for name in [n for n, t in broker.topics.items() if not t.ephemeral]:
            broker.delete_topic(name)
        self.followed.clear()
        self.links.clear()
        self.local_channels.clear()

    # -- following the list ----------------------------------------------------------------------

    def _follow(self, topics: dict[str, TopicFollow], now: float) -> None:
        broker = self.broker
        for name in list(self.followed):
            if name not in topics:
                self._unfollow(name)
        for name, follow in topics.items():
            try:
                topic = broker.get_topic(name)
            except BackendError as exc:
                log.error("MIRROR: TOPIC(%s): cannot open its copy: %s", name, exc)
                continue
            previous = self.followed.get(name)
            self.followed[name] = follow
            self.links.setdefault(name, TopicLink(name))
            topic.following = True
            self._follow_topic(topic, follow, previous)

    def _unfollow(self, name: str) -> None:
        self.followed.pop(name, None)
        self.links.pop(name, None)
        self.local_channels = {(t, c) for t, c in self.local_channels if t != name}
        if self.broker.topic_or_none(name) is not None:
            log.info("MIRROR: TOPIC(%s): deleted on the primary, deleted here", name)
            self.broker.delete_topic(name)

    def _follow_topic(
        self, topic: Topic, follow: TopicFollow, previous: TopicFollow | None
    ) -> None:
        if previous is None or previous.policy != follow.policy:
            try:
                changes = parse_update(dict(follow.policy))
                # Keys the primary no longer sets go back to the defaults.
                for key in topic.policy_settings.keys() - changes.keys():
                    topic.policy_settings.pop(key)
                topic.set_policy(changes)
            except (PolicyError, BackendError) as exc:
                log.error("MIRROR: TOPIC(%s): policy not applied: %s", topic.name, exc)
        if topic.paused != follow.paused:
            topic.paused = follow.paused
            topic.ctx.events.metadata_changed()
        follow_pumped(topic, follow.pumped)
        wanted = follow.channel_map
        before = previous.channel_map if previous is not None else {}
        for name in list(topic.channels):
            if (topic.name, name) in self.local_channels:
                self._read_all(topic.name, name)
            elif name not in wanted and not is_ephemeral(name):
                log.info("MIRROR: CHANNEL(%s:%s): deleted on the primary, deleted here",
                         topic.name, name)  # fmt: skip
                topic.delete_channel(name)
        oldest: int | None = None
        link = self.links[topic.name]
        link.channels = len(wanted)
        link.untracked = 0
        for name, state in wanted.items():
            try:
                channel = topic.get_channel(name)
            except BackendError as exc:
                log.error("MIRROR: CHANNEL(%s:%s): cannot open: %s", topic.name, name, exc)
                continue
            follow_channel(channel, state.position, state.skips)
            if channel.paused != state.paused:
                channel.paused = state.paused
                topic.ctx.events.metadata_changed()
            old = before.get(name)
            if old is None or old.policy != state.policy:
                try:
                    channel.set_policy(parse_channel_policy(dict(state.policy)))
                except PolicyError as exc:
                    log.error("MIRROR: CHANNEL(%s:%s): policy not applied: %s",
                              topic.name, name, exc)  # fmt: skip
            if state.unfinished:
                first = state.unfinished[0][0]
                oldest = first if oldest is None else min(oldest, first)
            link.untracked += state.untracked
        keep_unfinished(topic, oldest)

    async def _save(self) -> None:
        """Write the followed state if it changed (a worker thread; failures logged)."""
        snapshot = (dict(self.followed), set(self.local_channels))
        if snapshot == self._saved:
            return
        try:
            await trio.to_thread.run_sync(_save_followed, self._data_path, *snapshot)
        except OSError as exc:
            log.error("MIRROR: cannot write %s: %s", STATE_FILENAME, exc)
            return
        self._saved = snapshot

    def save_now(self) -> None:
        """Write the followed state (blocking: shutdown, promotion)."""
        _save_followed(self._data_path, self.followed, self.local_channels)

    # -- the fetch -------------------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        client = self._new_client()
        try:
            await self.contacted.wait()
            while True:
                request = self._fetch_body()
                if request is None:
                    self._topics_changed = trio.Event()
                    with trio.move_on_after(POLL_S):
                        await self._topics_changed.wait()
                    continue
                query = self._query(wait_ms=str(FETCH_WAIT_MS))
                try:
                    answer = await client.request(
                        "POST", "/mirror/fetch?" + query, request,
                        [("Content-Type", "application/json")],
                    )  # fmt: skip
                except HttpClientError as exc:
                    await trio.sleep(self._failed(str(exc)))
                    continue
                if answer.status != 200:
                    await trio.sleep(
                        self._failed(f"fetch: HTTP {answer.status} {answer.body[:120]!r}")
                    )
                    continue
                self._succeeded()
                try:
                    sections = decode_sections(answer.body)
                except ValueError as exc:
                    await trio.sleep(self._failed(f"fetch: malformed answer ({exc})"))
                    continue
                self._apply(sections, request)
                await self._sync_waited(sections)
                await trio.lowlevel.checkpoint()
        finally:
            await client.aclose()

    def _fetch_body(self) -> bytes | None:
        topics = {}
        for name in self.links:
            topic = self.broker.topic_or_none(name)
            if topic is None or not topic.following:
                continue
            stream = topic.stream
            link = self.links[name]
            acked = link.acked if topic.durable else stream.next_offset
            topics[name] = [stream.next_offset, min(acked, stream.next_offset)]
        if not topics:
            return None
        return json.dumps({"topics": topics}).encode()

    def _apply(self, sections: list[Any], request: bytes) -> None:
        asked_at = json.loads(request)["topics"]
        now = trio.current_time()
        for section in sections:
            name = section.topic
            topic = self.broker.topic_or_none(name)
            link = self.links.get(name)
            if topic is None or link is None or not topic.following or name not in asked_at:
                continue
            stream = topic.stream
            log_ = stream.log
            assert log_ is not None
            asked = asked_at[name][0]
            if stream.next_offset != asked:
                continue  # the copy changed meanwhile (deleted and made again): ask again
            try:
                entries = decode_copies(section.frames, log_.timebase)
            except ValueError as exc:
                log.error("MIRROR: TOPIC(%s): malformed copies: %s", name, exc)
                continue
            try:
                store_copies(topic, entries)
                advance_copy(topic, section.next_offset)
            except BackendError as exc:
                log.error("MIRROR: TOPIC(%s): cannot store the copies: %s", name, exc)
                self.broker.set_health(str(exc))
                continue
            link.answered(section, asked, copy_spans(entries), copy_was_empty=asked == 0,
                          now=now)  # fmt: skip
            self._acknowledge(topic, link)

    async def _sync_waited(self, sections: list[Any]) -> None:
        """Publishes on the primary wait for this mirror (``--min-insync-mirrors``): a
        ``--durable`` mirror fsyncs what it copied of those topics before it fetches again, so
        that the next fetch acknowledges it (otherwise the long poll would hold it back)."""
        if not self.broker.options.durable:
            return
        for section in sections:
            if section.waiting and section.frames:
                try:
                    await self.broker.wait_durable(section.topic)
                except BackendError as exc:
                    log.error("MIRROR: TOPIC(%s): cannot sync the copies: %s", section.topic,
                              exc)  # fmt: skip

    def _acknowledge(self, topic: Topic, link: TopicLink) -> None:
        end = topic.stream.next_offset
        if not topic.durable:
            link.acked = end
            return

        def synced(error: OSError | None) -> None:
            if error is None:
                link.acked = max(link.acked, end)

        if not self.broker.after_durable(topic.name, synced):
            link.acked = end

    # -- contact -----------------------------------------------------------------------------------

    def _failed(self, error: str) -> float:
        first = self.backoff.failures == 0
        delay = self.backoff.failed(error)
        if first or self.connected:
            log.warning("MIRROR: primary %s: %s (retrying in %.1fs, backing off)",
                        self._primary, error, delay)  # fmt: skip
        self.connected = False
        return delay

    def _succeeded(self) -> None:
        if self.backoff.failures:
            log.info("MIRROR: primary %s answers again after %d failed request(s)",
                     self._primary, self.backoff.failures)  # fmt: skip
        self.backoff.succeeded()
        self.connected = True
        self.last_contact = trio.current_time()
        self.last_contact_ns = self.broker.engine.wall_clock()

    # -- statistics --------------------------------------------------------------------------------

    def statistics(self, now: float) -> MirrorStats:
        wall = self.broker.engine.wall_clock()
        topics = []
        for name in sorted(self.links):
            topic = self.broker.topic_or_none(name)
            end = topic.stream.next_offset if topic is not None else 0
            topics.append(
                self.links[name].statistics(
                    end, connected=self.connected, now=now, wall_ns=wall,
                    last_contact_ns=self.last_contact_ns,
                )
            )  # fmt: skip
        order = ("following", "catching_up", "disconnected", "gap")
        state = max((t.state for t in topics), key=order.index, default="following")
        if not self.connected:
            state = "disconnected" if state != "gap" else state
        return MirrorStats(
            primary=self._primary,
            primary_node_id=self.primary_node_id,
            primary_epoch=self.primary_epoch,
            node_id=self.role.node_id,
            epoch=self.role.epoch,
            state=state,
            last_contact=self.last_contact_ns / 1e9,
            seconds_since_contact=now - self.last_contact if self.last_contact_ns else -1.0,
            failures=self.backoff.failures,
            last_error=self.backoff.last_error,
            topics=tuple(topics),
        )
