"""Replication (docs/mirrors.md): a mirror follows a primary's topic logs offset-exact and its
channels' positions, serves reads, refuses writes, and is promoted by one call.

``role.py`` who a node is (identity, epoch, whom it follows); ``wire.py`` and ``frames.py`` what
the two sides say (topic lists with channel positions, fetch sections, copy frames);
``primary.py`` a primary's mirrors and their holds on its topics (``lmqd.engine.holds``);
``planner.py`` a mirror's bookkeeping, sans I/O (missing offsets, state, lag, backoff);
``follower.py`` a mirror's tasks and its refusal of writes; ``service.py`` the node's side and
the promotion; ``metrics.py`` the Prometheus collector. The engine does the storage work in
plain ``def``s (``lmqd.engine.replica``); the HTTP endpoints are ``lmqd.httpapi.mirror``.
"""
