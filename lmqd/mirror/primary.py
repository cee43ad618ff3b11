"""The primary's side: its mirrors, their holds on its topics, what it tells them.

Theory of operation
-------------------
A mirror makes itself known with every request (``/mirror/topics``, ``/mirror/fetch``: its id,
its own address, whether it is durable); the registry keeps one ``MirrorLink`` per mirror id
(``statistics``: the primary lists its mirrors in ``/stats`` and ``/metrics``) and, per topic,
the mirror's **hold** (``lmqd.engine.holds``): made at the mirror's first fetch of the topic, at
once for every known mirror when a topic is created (so that nothing published and consumed
before the mirror's next look at the topic list is missed), restored from the topic's log at
start-up (its cursor ``#mirror:<id>``), moved by each fetch to what the mirror has copied
(``acked``), and bounded: ``sweep`` (once a second, ``run``) releases what lags more than
``--mirror-max-lag`` messages behind a topic's end, counts it and logs it once per episode.
``POST /mirror/forget?id=`` drops a mirror for good (its holds go, and the log may delete what
only they kept).

**Long polls.** A fetch that finds nothing new waits (``watch``) until one of its topics takes a
message or its time is up: the topic's stream calls ``on_append`` once per publish batch while
someone waits (one attribute test per batch otherwise), and a mirror that keeps up hears of a
message within a round trip instead of a polling interval.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Sequence
from functools import partial

import attrs
import trio

from lmqd.broker import Broker
from lmqd.engine.holds import MirrorHold, restored_holds
from lmqd.engine.topic import Topic
from lmqd.mirror.role import NodeRole
from lmqd.mirror.stats import MirrorHoldStats, MirrorLinkStats
from lmqd.options import Options

__all__ = ["SWEEP_S", "MirrorLink", "MirrorRegistry"]

log = logging.getLogger("lmqd.mirror")

SWEEP_S = 1.0
"""How often the holds are checked against ``--mirror-max-lag``: a comparison per hold."""


@attrs.define
class MirrorLink:
    """One mirror as its primary knows it."""

    mirror_id: str
    address: str = ""
    """The mirror's own HTTP address, as it says (empty until it says)."""
    remote: str = ""
    """Where its requests come from."""
    durable: bool = False
    last_contact: float = -math.inf
    """Trio time of its last request."""
    last_contact_wall: float = 0.0
    """Unix time of its last request (0: none since this primary started)."""
    releasing: set[str] = attrs.Factory(set)
    """Topics whose hold this mirror lagged past the limit of (logged once per episode)."""


class MirrorRegistry:
    """A primary's mirrors and their holds; see the module docstring."""

    def __init__(self, broker: Broker, role: NodeRole) -> None:
        self.broker = broker
        self.role = role
        self.links: dict[str, MirrorLink] = {}
        self.holds: dict[str, dict[str, MirrorHold]] = {}
        """Mirror id -> topic name -> its hold."""
        self._watchers: dict[str, list[trio.Event]] = {}
        broker.add_observer(self)

    @property
    def options(self) -> Options:
        return self.broker.options

    # -- start-up and topics ------------------------------------------------------------------

    def restore(self) -> None:
        """Take back the holds the topics' logs kept from an earlier run (after the broker's
        restore)."""
        for topic in list(self.broker.topics.values()):
            for mirror_id in restored_holds(topic.stream):
                # (Its channels noted what their stores hold when they were restored.)
                self._hold(mirror_id, topic, note_stored=False)
                self.links.setdefault(mirror_id, MirrorLink(mirror_id))

    def topic_created(self, topic: str) -> None:
        t = self.broker.topic_or_none(topic)
        if t is None or t.ephemeral or t.stream.log is None:
            return
        now = trio.current_time()
        for mirror_id, link in self.links.items():
            # In sync from the start (--min-insync-mirrors) as far as its last contact says:
            # the first publish, which made the topic, is not refused for want of a fetch.
            self._hold(mirror_id, t).joined(link.last_contact, now)

    def topic_deleted(self, topic: str, channels: Sequence[str]) -> None:
        for holds in self.holds.values():
            holds.pop(topic, None)  # their log cursors went with the log
        self._wake(topic)

    def channel_created(self, topic: str, channel: str) -> None:
        pass

    def channel_deleted(self, topic: str, channel: str) -> None:
        pass

    def options_changed(self, options: Options) -> None:
        pass

    # -- what the HTTP endpoints call ----------------------------------------------------------

    def contact(
        self, mirror_id: str, *, address: str, remote: str, durable: bool, now: float
    ) -> MirrorLink:
        """A request from mirror ``mirror_id``; its link (new ones get holds on every topic)."""
        link = self.links.get(mirror_id)
        if link is None:
            link = self.links[mirror_id] = MirrorLink(mirror_id)
            log.info("MIRROR(%s): new mirror at %s", mirror_id, address or remote)
            for topic in self.mirrored_topics():
                self._hold(mirror_id, topic)
        link.address = address
        link.remote = remote
        link.durable = durable
        link.last_contact = now
        link.last_contact_wall = time.time()
        return link

    def mirrored_topics(self) -> list[Topic]:
        """The topics a mirror follows: every one with a log (not ephemeral)."""
        return [
            t for t in self.broker.topics.values()
            if not t.ephemeral and t.stream.log is not None and not t.exiting
        ]  # fmt: skip

    def hold(self, mirror_id: str, topic: Topic) -> tuple[MirrorHold, bool]:
        """The mirror's hold on ``topic`` and whether it was made now."""
        hold = self.holds.get(mirror_id, {}).get(topic.name)
        if hold is not None and hold.stream is topic.stream:
            return hold, False
        return self._hold(mirror_id, topic), True

    def _hold(self, mirror_id: str, topic: Topic, *, note_stored: bool = True) -> MirrorHold:
        holds = self.holds.setdefault(mirror_id, {})
        hold = holds.get(topic.name)
        if hold is None or hold.stream is not topic.stream:
            first = not topic.stream.held
            hold = holds[topic.name] = MirrorHold(topic.stream, mirror_id)
            if first and note_stored:
                # What the channels stored before a mirror held the topic: by offset too.
                for channel in list(topic.channels.values()):
                    channel.keeping.note_stored()
        return hold

    def forget(self, mirror_id: str) -> bool:
        """Drop a mirror and its holds; False if it is not known."""
        link = self.links.pop(mirror_id, None)
        holds = self.holds.pop(mirror_id, {})
        for hold in holds.values():
            hold.delete()
        if link is None and not holds:
            return False
        log.info("MIRROR(%s): forgotten (%d hold(s) released)", mirror_id, len(holds))
        return True

    # -- waiting for news ------------------------------------------------------------------------

    def watch(self, topics: Iterable[Topic]) -> trio.Event:
        """An event set when one of ``topics`` takes a message (or is deleted)."""
        event = trio.Event()
        for topic in topics:
            watchers = self._watchers.setdefault(topic.name, [])
            watchers.append(event)
            topic.stream.on_append = partial(self._wake, topic.name)
        return event

    def unwatch(self, topics: Iterable[Topic], event: trio.Event) -> None:
        for topic in topics:
            watchers = self._watchers.get(topic.name)
            if watchers is None:
                continue
            if event in watchers:
                watchers.remove(event)
            if not watchers:
                del self._watchers[topic.name]
                topic.stream.on_append = None

    def _wake(self, topic: str) -> None:
        for event in self._watchers.get(topic, ()):
            event.set()

    # -- the bound -----------------------------------------------------------------------------

    def sweep(self) -> None:
        """Release what lags past ``--mirror-max-lag`` (see the module docstring)."""
        limit = self.options.mirror_max_lag
        if limit <= 0:
            return
        for mirror_id, holds in self.holds.items():
            link = self.links.get(mirror_id)
            for name, hold in holds.items():
                released = hold.release(limit)
                if not released:
                    if link is not None:
                        link.releasing.discard(name)
                    continue
                if link is None or name not in link.releasing:
                    log.warning(
                        "MIRROR(%s): TOPIC(%s): the mirror lags more than %d messages behind: "
                        "releasing what it has not copied (%d so far); it will report a gap",
                        mirror_id, name, limit, hold.released,
                    )  # fmt: skip
                    if link is not None:
                        link.releasing.add(name)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sweep once a second, and fail the publishes held for the mirrors past
        ``--mirror-ack-timeout`` (``lmqd.engine.insync``), until cancelled."""
        task_status.started()
        insync = self.broker.insync
        # A publish held after this task went to sleep is looked at within a tick: it fails at
        # most a quarter of its timeout (and a second) late.
        tick = min(SWEEP_S, insync.timeout / 4)
        next_sweep = trio.current_time() + SWEEP_S
        while True:
            now = trio.current_time()
            await trio.sleep_until(min(next_sweep, now + tick, insync.next_deadline))
            now = trio.current_time()
            failed = insync.expire(now)
            if failed:
                log.warning("MIRROR: %d publish(es) not stored by their mirrors within %gs: "
                            "failed", failed, insync.timeout)  # fmt: skip
            if now >= next_sweep:
                next_sweep = now + SWEEP_S
                if self.holds:
                    self.sweep()

    # -- statistics ------------------------------------------------------------------------------

    def statistics(self, now: float) -> list[MirrorLinkStats]:
        """One snapshot per known mirror, sorted by id."""
        out = []
        timeout = self.options.mirror_ack_timeout
        to_wall = time.time() - now  # trio time -> Unix time
        for mirror_id in sorted(self.links):
            link = self.links[mirror_id]
            holds = self.holds.get(mirror_id, {})
            per_topic = tuple(
                MirrorHoldStats(
                    topic_name=name,
                    in_sync=(in_sync := hold.in_sync(now, timeout)),
                    in_sync_since=hold.in_sync_since + to_wall if in_sync else 0.0,
                    stored_offset=hold.fetched_from,
                    synced_offset=hold.copied,
                    end_offset=hold.stream.next_offset,
                    lag_messages=hold.lag,
                )
                for name, hold in sorted(holds.items())
            )
            synced = [h for h in per_topic if h.in_sync]
            all_in_sync = bool(per_topic) and len(synced) == len(per_topic)
            out.append(
                MirrorLinkStats(
                    mirror_id=mirror_id,
                    address=link.address,
                    remote_address=link.remote,
                    durable=link.durable,
                    last_contact=link.last_contact_wall,
                    seconds_since_contact=(
                        now - link.last_contact if link.last_contact > -math.inf else -1.0
                    ),
                    lag_messages=sum(h.lag for h in holds.values()),
                    released_messages=sum(h.released for h in holds.values()),
                    topics=len(holds),
                    in_sync=all_in_sync,
                    in_sync_since=max(h.in_sync_since for h in synced) if all_in_sync else 0.0,
                    topics_in_sync=len(synced),
                    holds=per_topic,
                )
            )
        return out

    def mirrors_in_sync(self, now: float) -> dict[str, tuple[int, int]]:
        """Per topic a mirror follows, how many of its mirrors are in sync at ``now`` and how
        many its publishes wait for (its ``min_insync_mirrors``)."""
        timeout = self.options.mirror_ack_timeout
        topics = self.mirrored_topics()
        counts = dict.fromkeys((t.name for t in topics), 0)
        for holds in self.holds.values():
            for name, hold in holds.items():
                if name in counts and hold.in_sync(now, timeout):
                    counts[name] += 1
        return {t.name: (counts[t.name], t.policy.min_insync_mirrors) for t in topics}
