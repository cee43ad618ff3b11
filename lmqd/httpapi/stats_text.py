"""``/stats`` in its default text format: nsqd's ``printStats`` layout, line for line.

The layout (``nsqd/http.go: printStats`` and ``ClientV2Stats.String`` in v1.3.0)::

    lmqd v0.1.0 (nsqd 1.3.0 compatible, built w/python3.11.9)
    start_time 2024-01-01T00:00:00Z
    uptime 1h2m3.5s

    Health: OK

    Memory:
       heap_objects             \t123
       ...

    Topics:
       [t              ] depth: 0     be-depth: 0     msgs: 10       e2e%: 1.2ms, 3.4ms
          [c                        ] depth: 0     be-depth: 0     inflt: 0    def: 0    ...
            [V2 host:port ua       ] state: 3 inflt: 0    rdy: 1    fin: 10       re-q: 0 ...

    Producers:
       [V2 host:port ua       ] msgs: 10       topics: t=10 connected: 5s

Only the first line differs from nsqd (which prints ``nsqd v1.3.0 (built w/go1.21.5)``).
Paused topics and channels are marked ``*P``; ``Topics: None`` / ``Producers: None`` when empty.
Durations are Go's ``time.Duration.String()``; e2e percentiles Go's ``NanoSecondToHuman``.
"""

from __future__ import annotations

import datetime
import platform
from collections.abc import Mapping, Sequence

from lmqd import NSQD_COMPAT_VERSION, __version__
from lmqd.stats import ClientStats, E2eLatency, TopicStats

__all__ = ["format_stats", "go_duration", "nanoseconds_to_human", "rfc3339"]


def version_line() -> str:
    """What stands where nsqd prints ``nsqd v1.3.0 (built w/go1.21.5)``."""
    return (
        f"lmqd v{__version__} (nsqd {NSQD_COMPAT_VERSION} compatible, "
        f"built w/python{platform.python_version()})"
    )


def _fraction(value: int, unit: int) -> str:
    whole, rest = divmod(value, unit)
    if not rest:
        return str(whole)
    digits = len(str(unit)) - 1
    return f"{whole}.{rest:0{digits}d}".rstrip("0")


def go_duration(ns: int) -> str:
    """Go's ``time.Duration.String()``: ``0s``, ``1.5µs``, ``250ms``, ``1h0m0s``, ``2m3.5s``."""
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    u = abs(ns)
    if u < 1_000:
        return f"{sign}{u}ns"
    if u < 1_000_000:
        return f"{sign}{_fraction(u, 1_000)}µs"
    if u < 1_000_000_000:
        return f"{sign}{_fraction(u, 1_000_000)}ms"
    seconds, frac = divmod(u, 1_000_000_000)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    out = sign
    if hours:
        out += f"{hours}h"
    if hours or minutes:
        out += f"{minutes}m"
    return out + _fraction(secs * 1_000_000_000 + frac, 1_000_000_000) + "s"


def nanoseconds_to_human(v: float) -> str:
    """nsq's ``stringy.NanoSecondToHuman``: one decimal, in s / ms / us / ns."""
    if v > 1_000_000_000:
        return f"{v / 1_000_000_000:0.1f}s"
    if v > 1_000_000:
        return f"{v / 1_000_000:0.1f}ms"
    if v > 1_000:
        return f"{v / 1_000:0.1f}us"
    return f"{v:0.1f}ns"


def _e2e(latency: E2eLatency) -> str:
    # quantile.Result.String(): the values, human readable, joined by ", " ("" if none).
    if not latency.percentiles:
        return ""
    return ", ".join(nanoseconds_to_human(p.value) for p in latency.percentiles)


def rfc3339(unix_seconds: int) -> str:
    """Go's ``time.Unix(t, 0).Format(time.RFC3339)`` in the local zone (``Z`` for UTC)."""
    when = datetime.datetime.fromtimestamp(unix_seconds).astimezone()
    offset = when.utcoffset()
    if not offset:
        return when.strftime("%Y-%m-%dT%H:%M:%SZ")
    return when.isoformat(timespec="seconds")


def _port(remote_address: str) -> str:
    # net.SplitHostPort's port, "" when the address has none.
    host, sep, port = remote_address.rpartition(":")
    return port if sep and (not host.count(":") or host.startswith("[")) else ""


def format_client(client: ClientStats, now: float) -> str:
    """``ClientV2Stats.String()``: a producer line when it has published, else a consumer's."""
    connected = go_duration(max(0, int(now - client.connect_ts)) * 1_000_000_000)
    ident = f"{client.hostname}:{_port(client.remote_address)} {client.user_agent}"
    if client.pub_counts:
        total = sum(p.count for p in client.pub_counts)
        topics = ",".join(f"{p.topic}={p.count}" for p in client.pub_counts)
        return (
            f"[{client.version} {ident:<21}] msgs: {total:<8d} topics: {topics} "
            f"connected: {connected}"
        )
    return (
        f"[{client.version} {ident:<21}] state: {client.state} "
        f"inflt: {client.in_flight_count:<4d} rdy: {client.ready_count:<4d} "
        f"fin: {client.finish_count:<8d} re-q: {client.requeue_count:<8d} "
        f"msgs: {client.message_count:<8d} connected: {connected}"
    )


def format_stats(
    *,
    topics: Sequence[TopicStats],
    producers: Sequence[ClientStats],
    memory: Mapping[str, int] | None,
    health: str,
    start_time: int,
    now: float,
) -> str:
    """The whole text document; ``now`` is wall-clock seconds (uptime, connected times)."""
    lines = [
        version_line(),
        f"start_time {rfc3339(start_time)}",
        f"uptime {go_duration(max(0, round((now - start_time) * 1_000_000_000)))}",
        "",
        f"Health: {health}",
    ]
    if memory is not None:
        lines += ["", "Memory:"]
        lines += [f"   {key:<25}\t{value}" for key, value in memory.items()]
    out = "\n".join(lines) + "\n"
    out += "\nTopics:" if topics else "\nTopics: None\n"
    for t in topics:
        prefix = "*P " if t.paused else "   "
        out += (
            f"\n{prefix}[{t.topic_name:<15}] depth: {t.depth:<5d} "
            f"be-depth: {t.backend_depth:<5d} msgs: {t.message_count:<8d} "
            f"e2e%: {_e2e(t.e2e_processing_latency)}\n"
        )
        for c in t.channels:
            prefix = "   *P " if c.paused else "      "
            out += (
                f"{prefix}[{c.channel_name:<25}] depth: {c.depth:<5d} "
                f"be-depth: {c.backend_depth:<5d} inflt: {c.in_flight_count:<4d} "
                f"def: {c.deferred_count:<4d} re-q: {c.requeue_count:<5d} "
                f"timeout: {c.timeout_count:<5d} msgs: {c.message_count:<8d} "
                f"e2e%: {_e2e(c.e2e_processing_latency)}\n"
            )
            for client in c.clients or ():
                out += f"        {format_client(client, now)}\n"
    if not producers:
        out += "\nProducers: None\n"
    else:
        out += "\nProducers:\n"
        for client in producers:
            out += f"   {format_client(client, now)}\n"
    return out
