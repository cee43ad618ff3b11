"""Replication: a node's side of it, primary or mirror, and the promotion from one to the other.

``LmqDaemon`` makes one ``Replication`` and starts it after the restore: it reads the node's
role (``role.py``), and either follows ``--mirror-of`` (``follower.py``; the broker's
``guard`` refuses writes meanwhile) or serves mirrors (``primary.py``). The HTTP API
(``lmqd.httpapi.mirror``) and the metrics ask it for what it knows.

**Promotion** (``promote``: ``POST /mirror/promote``, ``lmqadmin mirror promote``): the follower
stops; every followed topic's channels stand where the primary's last stood, get copies of what
they held unfinished (``replica.restore_unfinished``; the messages of untracked ones found by id
in the copy, as far as it still has them), and the topic pumps again; a ``--durable`` node
fsyncs the channels' stores before it answers. The role file then records the new epoch (the
primary's plus one) and whom it took over from; the guard goes, lookupd registration announces
every topic, and the node serves mirrors of its own. Everything up to the role file is in
memory and the logs: a crash in between leaves a mirror that a restart resumes as one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import trio

from lmqd.broker import Broker
from lmqd.engine.backend import BackendError, StoredQueue
from lmqd.engine.channel import Channel
from lmqd.engine.replica import follow_channel, follow_pumped, promote_topic, restore_unfinished
from lmqd.engine.topic import Topic
from lmqd.mirror.follower import STATE_FILENAME, Follower, MirrorRefused
from lmqd.mirror.primary import MirrorRegistry
from lmqd.mirror.role import NodeRole, Peer, load_role, save_role
from lmqd.mirror.stats import InSyncStats, MirrorLinkStats, MirrorStats
from lmqd.mirror.wire import from_ranges
from lmqd.net import split_address
from lmqd.storage import run_sync_jobs
from lmqd.transport.http_client import HttpClient
from lmqd.transport.tls import client_context

__all__ = ["NotAMirror", "Replication"]

log = logging.getLogger("lmqd.mirror")

SCAN_CHUNK = 8192
"""Messages read per step when untracked messages are looked for by id at a promotion."""


class NotAMirror(Exception):
    """A promotion asked of a node that follows nobody."""


class Replication:
    """One node's replication: its role, and its follower or its registry of mirrors."""

    def __init__(self, broker: Broker, *, announce: Callable[[], None]) -> None:
        """``announce``: register every topic and channel with the lookupds (a promotion)."""
        self.broker = broker
        self._announce = announce
        self.role = NodeRole.new()
        self.follower: Follower | None = None
        self.registry: MirrorRegistry | None = None
        self._nursery: trio.Nursery | None = None
        self._promoting = False

    @property
    def options(self) -> Any:
        return self.broker.options

    # -- start -------------------------------------------------------------------------------

    def load(self) -> None:
        """Blocking (a worker thread): read, or make and write, the node's role. Raises
        ``RoleFileError``, ``OSError``."""
        data_path = self.options.data_path
        role, existed = load_role(data_path)
        self.role = role
        if not existed:
            save_role(data_path, role)

    async def start(self, nursery: trio.Nursery) -> None:
        """After the restore: follow ``--mirror-of``, or serve mirrors. Raises
        ``MirrorRefused`` for a data directory a mirror must not use."""
        self._nursery = nursery
        options = self.options
        if not options.mirror_of:
            self._serve_mirrors()
            return
        own = [n for n, t in self.broker.topics.items() if not t.ephemeral]
        took = self.role.promoted_from
        if self.role.following is None and own:
            if not options.mirror_force and took is not None:
                raise MirrorRefused(
                    f"--mirror-of {options.mirror_of}: this node was promoted over "
                    f"{took.address} (epoch {self.role.epoch}): following a primary again would "
                    "drop what it accepted since; --mirror-force copies the primary afresh"
                )
            if not options.mirror_force:
                raise MirrorRefused(
                    f"--mirror-of {options.mirror_of}: --data-path {options.data_path} holds "
                    f"topics of this node's own ({len(own)}, e.g. {own[0]}); a mirror starts "
                    "from an empty data directory, or --mirror-force drops them"
                )
            log.warning("MIRROR: --mirror-force: dropping %d topic(s) of this node's own",
                        len(own))  # fmt: skip
            for name in own:
                self.broker.delete_topic(name)
        follower = Follower(
            self.broker,
            self.role,
            primary=_address_of(options.mirror_of),
            client=self._client,
            save_role=self._save_role,
            own_address=self._own_address,
        )
        self.follower = follower
        self.broker.guard = follower
        for (topic, channel) in follower.local_channels:
            follower.add_local_channel(topic, channel)
        for topic_ in self.broker.topics.values():
            if not topic_.ephemeral:
                topic_.following = True  # every stored topic of a mirror is its primary's
        await nursery.start(follower.run)

    def _serve_mirrors(self) -> None:
        registry = MirrorRegistry(self.broker, self.role)
        registry.restore()
        self.registry = registry
        assert self._nursery is not None
        self._nursery.start_soon(registry.run)

    def _client(self) -> HttpClient:
        options = self.options
        https, host, port = _split_primary(options.mirror_of)
        context = None
        if https:
            context = client_context(
                ca_file=options.mirror_tls_root_ca_file or None,
                cert_file=options.mirror_tls_cert or None,
                key_file=options.mirror_tls_key or None,
                verify=not options.mirror_tls_insecure_skip_verify,
            )
        return HttpClient(
            host, port, ssl_context=context,
            connect_timeout=options.http_client_connect_timeout,
            request_timeout=max(options.http_client_request_timeout, 10.0),
        )  # fmt: skip

    def _save_role(self, role: NodeRole) -> None:
        self.role = role
        save_role(self.options.data_path, role)

    def _own_address(self) -> str:
        bound = self.broker.addresses
        options = self.options
        if bound is None or bound.http is None:
            return ""
        return f"{options.broadcast_address}:{options.broadcast_http_port or bound.http[1]}"

    # -- promotion ---------------------------------------------------------------------------

    async def promote(self) -> dict[str, Any]:
        """Make this mirror a primary (see the module docstring); a summary of what was done.
        Raises ``NotAMirror``."""
        follower = self.follower
        if follower is None or self._promoting:
            raise NotAMirror("this node follows no primary")
        self._promoting = True
        started = time.perf_counter()
        await follower.stop()
        now = trio.current_time()
        summary: dict[str, Any] = {
            "topics": 0, "channels": 0, "restored": 0, "missing": 0, "untracked": 0,
        }  # fmt: skip
        durable_queues: list[StoredQueue] = []
        for name, follow in sorted(follower.followed.items()):
            topic = self.broker.topic_or_none(name)
            if topic is None:
                continue
            follow_pumped(topic, follow.pumped)
            for cname, state in follow.channels:
                channel = topic.channel_or_none(cname)
                if channel is None:
                    continue
                follow_channel(channel, state.position, state.skips)
                offsets = from_ranges(state.unfinished)
                if state.untracked_ids:
                    offsets += await _find_ids(topic, state.untracked_ids)
                offsets.sort()
                log_ = topic.stream.log
                assert log_ is not None
                due = {o: log_.timebase.from_wall_ns(ms * 1_000_000) for o, ms in state.deferred}
                try:
                    found = restore_unfinished(channel, offsets, now, due=due,
                                               attempts=dict(state.attempts))  # fmt: skip
                except BackendError as exc:
                    # A durable channel's stores refused them: the promotion goes on (the
                    # node is the primary now either way), and says what it could not do.
                    log.error("MIRROR: CHANNEL(%s:%s): %d unfinished messages not restored: %s",
                              name, cname, len(offsets), exc)  # fmt: skip
                    found = 0
                summary["channels"] += 1
                summary["restored"] += found
                summary["missing"] += len(offsets) - found
                summary["untracked"] += max(state.untracked - len(state.untracked_ids), 0)
                if channel.durable:
                    durable_queues += channel.disk_queues
            for cname in list(topic.channels):
                if (name, cname) in follower.local_channels:
                    _stop_reading_all(topic.channels[cname], topic)
            promote_topic(topic)
            summary["topics"] += 1
        if durable_queues:
            jobs = [job for q in durable_queues if (job := q.prepare_sync()) is not None]
            for job, error in zip(jobs, await trio.to_thread.run_sync(run_sync_jobs, jobs),
                                  strict=True):  # fmt: skip
                if error is not None:
                    log.error("MIRROR: promotion: sync of %s failed: %s", job.name, error)
        primary = Peer(follower.primary, follower.primary_node_id, follower.primary_epoch)
        role = NodeRole(
            self.role.node_id,
            max(self.role.epoch, primary.epoch) + 1,
            None,
            primary,
            int(time.time()),
        )
        await trio.to_thread.run_sync(self._after_promotion, role)
        self.broker.guard = None
        self.follower = None
        self._promoting = False
        self._serve_mirrors()
        self._announce()
        summary["epoch"] = role.epoch
        summary["seconds"] = round(time.perf_counter() - started, 3)
        log.warning(
            "MIRROR: PROMOTED: primary now (epoch %d, was a mirror of %s): %d topic(s), "
            "%d channel(s), %d unfinished message(s) restored, %d missing, %d untracked",
            role.epoch, primary.address, summary["topics"], summary["channels"],
            summary["restored"], summary["missing"], summary["untracked"],
        )  # fmt: skip
        return summary

    def _after_promotion(self, role: NodeRole) -> None:
        """Blocking: the role file, and the followed state goes."""
        self._save_role(role)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.options.data_path, STATE_FILENAME))

    def replica_of(self) -> list[str]:
        """The HTTP addresses of the nodes whose offsets this one has: the primary it follows,
        or the one it was promoted over."""
        follower = self.follower
        if follower is not None:
            return [follower.primary.removeprefix("https://")]
        took = self.role.promoted_from
        return [took.address.removeprefix("https://")] if took is not None else []

    # -- statistics --------------------------------------------------------------------------

    def mirror_statistics(self, now: float) -> MirrorStats | None:
        """The mirror's view of its primary (None on a primary)."""
        return self.follower.statistics(now) if self.follower is not None else None

    def link_statistics(self, now: float) -> list[MirrorLinkStats]:
        """A primary's mirrors (empty on a mirror)."""
        return self.registry.statistics(now) if self.registry is not None else []

    def mirrors_in_sync(self, now: float) -> dict[str, tuple[int, int]]:
        """On a primary, per topic its mirrors follow, how many are in sync and how many its
        publishes wait for (empty on a mirror)."""
        return self.registry.mirrors_in_sync(now) if self.registry is not None else {}

    def insync_statistics(self, now: float) -> InSyncStats | None:
        """A primary's publishes held for its mirrors (None on a mirror, and on a primary
        without ``--min-insync-mirrors`` none of whose topics has the policy)."""
        insync = self.broker.insync
        counts = self.mirrors_in_sync(now)
        if self.registry is None or not (insync.needed or any(n for _, n in counts.values())):
            return None
        return InSyncStats(
            min_insync_mirrors=insync.needed,
            mirror_ack_timeout=insync.timeout,
            waiting_publishes=insync.waiting_count,
            held_publishes=insync.held,
            refused_publishes=insync.refused,
            timed_out_publishes=insync.timed_out,
            topics_below=tuple(name for name, (n, needed) in sorted(counts.items()) if n < needed),
        )

    def status(self, now: float) -> dict[str, Any]:
        """``GET /mirror``."""
        role = self.role
        mirror = self.mirror_statistics(now)
        insync = self.insync_statistics(now)
        return {
            "role": "mirror" if self.follower is not None else "primary",
            "node_id": role.node_id,
            "epoch": role.epoch,
            "promoted_from": role.promoted_from.to_json() if role.promoted_from else None,
            "promoted_at": role.promoted_at,
            "mirror": mirror.to_dict() if mirror is not None else None,
            "mirrors": [m.to_dict() for m in self.link_statistics(now)],
            "min_insync": insync.to_dict() if insync is not None else None,
        }


def _split_primary(address: str) -> tuple[bool, str, int]:
    """``[https://]host:port`` -> (https, host, port); raises ``ValueError``."""
    https = address.startswith("https://")
    rest = address.removeprefix("https://").removeprefix("http://")
    host, port = split_address(rest)
    return https, host, port


def _address_of(address: str) -> str:
    https, host, port = _split_primary(address)
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return f"https://{shown}" if https else shown


def _stop_reading_all(channel: Channel, topic: Topic) -> None:
    """A mirror's own replay channel on a promoted topic: from now on the pump pushes its
    deferred and prioritised messages, as to any channel."""
    cursor = channel.cursor
    if cursor is not None:
        cursor.replay_until = topic.stream.pumped


async def _find_ids(topic: Topic, ids: tuple[str, ...]) -> list[int]:
    """The offsets of the messages with ``ids`` in the copy (a scan of what it stores, a chunk
    at a time)."""
    wanted = {i.encode("ascii") for i in ids}
    stream = topic.stream
    position = stream.earliest_offset
    found: list[int] = []
    while wanted and position < stream.next_offset:
        entries, following = stream.read_entries(position, SCAN_CHUNK)
        for offset, m in entries:
            if m.id in wanted:
                wanted.discard(m.id)
                found.append(offset)
        if following <= position:
            break
        position = following
        await trio.lowlevel.checkpoint()
    return found
