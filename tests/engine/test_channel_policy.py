"""``ChannelPolicy``: the one validator of a change, the defaults, and the backoff formula.

Rules for this module:
- Plain functions, no trio: the policy is data and its delay a pure function of the attempts
  and an injected ``random.Random``.
- Every refused input names its key in the message; a refused change is refused whole.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lmqd.config import ConfigError, resolve
from lmqd.engine.channel_policy import (
    CHANNEL_POLICY_KEYS,
    ChannelPolicy,
    PolicyError,
    parse_update,
)
from lmqd.options import MAX_ATTEMPTS, MAX_BACKOFF_MS, Options


def test_a_valid_change_is_returned_as_given() -> None:
    doc = {
        "max_attempts": 5,
        "dead_letter_topic": "orders.dead",
        "backoff_ms": 1000,
        "backoff_max_ms": 60_000,
        "backoff_jitter": 0.2,
    }
    assert parse_update(doc) == doc
    assert parse_update({"backoff_jitter": 1}) == {"backoff_jitter": 1.0}
    assert parse_update({"dead_letter_topic": ""}) == {"dead_letter_topic": ""}
    assert parse_update({}) == {}
    assert tuple(doc) == CHANNEL_POLICY_KEYS


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "the policy must be a JSON object"),
        ("max_attempts", "the policy must be a JSON object"),
        ({"max_tries": 1}, "unknown key 'max_tries' (known: max_attempts, dead_letter_topic, "
                           "backoff_ms, backoff_max_ms, backoff_jitter)"),
        ({"max_attempts": -1}, f"max_attempts must be an integer from 0 to {MAX_ATTEMPTS}"),
        ({"max_attempts": MAX_ATTEMPTS + 1}, "max_attempts must be an integer from 0 to 65535"),
        ({"max_attempts": 1.0}, "max_attempts must be an integer"),
        ({"max_attempts": True}, "max_attempts must be an integer"),
        ({"max_attempts": "5"}, "max_attempts must be an integer"),
        ({"backoff_ms": -5}, f"backoff_ms must be an integer from 0 to {MAX_BACKOFF_MS}"),
        ({"backoff_ms": MAX_BACKOFF_MS + 1}, "backoff_ms must be an integer from 0 to 3600000"),
        ({"backoff_max_ms": None}, "backoff_max_ms must be an integer"),
        ({"backoff_jitter": 1.5}, "backoff_jitter must be a number from 0 to 1"),
        ({"backoff_jitter": -0.1}, "backoff_jitter must be a number from 0 to 1"),
        ({"backoff_jitter": float("nan")}, "backoff_jitter must be a number from 0 to 1"),
        ({"backoff_jitter": False}, "backoff_jitter must be a number from 0 to 1"),
        ({"backoff_jitter": "0.5"}, "backoff_jitter must be a number from 0 to 1"),
        ({"dead_letter_topic": 5}, "dead_letter_topic must be a string"),
        ({"dead_letter_topic": "bad name"}, "dead_letter_topic must be a valid topic name"),
        ({"dead_letter_topic": "x" * 65}, "dead_letter_topic must be a valid topic name"),
        ({"dead_letter_topic": "dead#ephemeral"}, "dead_letter_topic must not be ephemeral"),
        # One bad key refuses the whole change, whatever its order.
        ({"max_attempts": 3, "backoff_ms": -1}, "backoff_ms must be"),
    ],
)
def test_bad_changes_are_refused_naming_the_key(doc: Any, message: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_update(doc)
    assert str(info.value).startswith(message)


def test_effective_policy_is_the_defaults_overridden_key_by_key() -> None:
    assert ChannelPolicy.effective(Options(), {}) == ChannelPolicy()
    options = Options(max_attempts=5, dead_letter_topic="dead", backoff_ms=100)
    policy = ChannelPolicy.effective(options, {"max_attempts": 0, "backoff_jitter": 0.5})
    assert policy.to_dict() == {
        "max_attempts": 0,
        "dead_letter_topic": "dead",
        "backoff_ms": 100,
        "backoff_max_ms": 0,
        "backoff_jitter": 0.5,
    }


def test_daemon_defaults_are_checked_at_start() -> None:
    options = resolve(
        {"max-attempts": "5", "dead-letter-topic": "dead", "backoff-jitter": "0.25"},
        {"backoff_ms": 1000, "backoff_max_ms": 60_000, "ttl_ms": 3_600_000},
    ).options
    assert (options.max_attempts, options.dead_letter_topic, options.backoff_jitter) == (
        5, "dead", 0.25,
    )
    assert (options.backoff_ms, options.backoff_max_ms, options.ttl_ms) == (1000, 60_000, 3_600_000)
    assert resolve({}, {"backoff_jitter": 1}).options.backoff_jitter == 1.0
    for flags, config, message in (
        ({"max-attempts": "65536"}, {}, "--max-attempts must be [0,65535]"),
        ({"backoff-ms": "3600001"}, {}, "--backoff-ms must be [0,3600000]"),
        ({"backoff-jitter": "1.5"}, {}, "--backoff-jitter must be [0,1]"),
        ({"backoff-jitter": "nan"}, {}, "not a finite number"),
        ({}, {"backoff_jitter": "x"}, "not a number"),
        ({}, {"backoff_jitter": True}, "want a number"),
        ({"dead-letter-topic": "bad name"}, {}, "--dead-letter-topic must be a valid"),
        ({"dead-letter-topic": "d#ephemeral"}, {}, "--dead-letter-topic must be a valid"),
        ({"ttl-ms": "-5"}, {}, "--ttl-ms must be >= 0"),
    ):
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
            resolve(flags, config)


# -- backoff ----------------------------------------------------------------------------------


def test_backoff_doubles_from_backoff_ms_up_to_the_cap() -> None:
    policy = ChannelPolicy(backoff_ms=1000, backoff_max_ms=5000)
    rng = random.Random(0)
    assert [policy.backoff_s(a, rng) for a in range(1, 7)] == [1.0, 2.0, 4.0, 5.0, 5.0, 5.0]
    assert policy.backoff_s(0, rng) == 1.0  # never delivered yet: the first step
    assert policy.backoff_s(10_000, rng) == 5.0  # no huge power computed
    uncapped = ChannelPolicy(backoff_ms=1000)  # backoff_max_ms 0: one hour
    assert uncapped.backoff_s(100, rng) == MAX_BACKOFF_MS / 1000
    assert not ChannelPolicy().backs_off
    assert uncapped.backs_off


@given(
    backoff_ms=st.integers(1, MAX_BACKOFF_MS),
    backoff_max_ms=st.integers(0, MAX_BACKOFF_MS),
    jitter=st.floats(0, 1),
    attempts=st.integers(1, 70_000),
    seed=st.integers(0, 2**32),
)
def test_backoff_lies_within_the_jitter_below_its_base(
    backoff_ms: int, backoff_max_ms: int, jitter: float, attempts: int, seed: int
) -> None:
    policy = ChannelPolicy(
        backoff_ms=backoff_ms, backoff_max_ms=backoff_max_ms, backoff_jitter=jitter
    )
    cap = backoff_max_ms or MAX_BACKOFF_MS
    base = min(cap, backoff_ms * 2 ** min(attempts - 1, 64)) / 1000
    delay = policy.backoff_s(attempts, random.Random(seed))
    assert base * (1 - jitter) - 1e-9 <= delay <= base + 1e-9
    # Growing with attempts: the next attempt's base is at least this one's.
    next_base = min(cap, backoff_ms * 2 ** min(attempts, 64)) / 1000
    assert next_base >= base


def test_backoff_randomness_is_injected() -> None:
    policy = ChannelPolicy(backoff_ms=1000, backoff_jitter=0.5)
    first = [policy.backoff_s(3, random.Random(7)) for _ in range(2)]
    assert first[0] == first[1]  # same seed, same delay
    rng = random.Random(7)
    expected = 4.0 * (1 - 0.5 * random.Random(7).random())
    assert policy.backoff_s(3, rng) == pytest.approx(expected)
