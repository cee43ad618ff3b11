"""One vocabulary of options: what each front end accepts, and the renamed names.

Rules for this module: no I/O; warnings are errors, so each deprecation is caught on purpose.
"""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import attrs
import pytest

from lmq_client import Consumer as AsyncConsumer
from lmq_client import Producer as AsyncProducer
from lmq_client.core.options import (
    RENAMED,
    ConsumerOptions,
    ConsumerSettings,
    ProducerOptions,
    ProducerSettings,
    dpub_delay_ms,
    from_settings,
)
from lmq_client.sync import Producer

CORE = Path(__file__).resolve().parents[3] / "lmq_client" / "core"


def test_the_settings_dicts_name_exactly_the_options_and_the_renamed_names() -> None:
    for options, settings in ((ConsumerOptions, ConsumerSettings),
                              (ProducerOptions, ProducerSettings)):  # fmt: skip
        names = {f.name for f in attrs.fields(options)} | set(RENAMED)
        assert set(typing.get_type_hints(settings)) == names


def test_the_renamed_timeout_warns_and_sets_both_timeouts() -> None:
    with pytest.warns(DeprecationWarning, match="timeout= is deprecated: use connect_timeout= "
                                                "and response_timeout="):  # fmt: skip
        producer = Producer("127.0.0.1:4150", timeout=3.0)  # type: ignore[call-arg]
    assert (producer.options.connect_timeout, producer.options.response_timeout) == (3.0, 3.0)
    with pytest.warns(DeprecationWarning, match="use connect_timeout=$"):
        options = from_settings(ConsumerOptions, {"timeout": 2.0, "connect_timeout": 4.0})
    assert options.connect_timeout == 4.0  # the new name wins


def test_front_ends_share_the_vocabulary_and_refuse_unknown_names() -> None:
    consumer = AsyncConsumer("t", "c", "a:1", connect_timeout=2.0, max_in_flight=9)
    producer = AsyncProducer("a:1", connect_timeout=2.0)
    assert (consumer.options.connect_timeout, consumer.options.max_in_flight) == (2.0, 9)
    assert producer.options.connect_timeout == 2.0
    with pytest.raises(TypeError, match="unknown ConsumerOptions setting 'max_inflight'"):
        AsyncConsumer("t", "c", "a:1", max_inflight=3)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="max_in_flight must be > 0"):
        ConsumerOptions(max_in_flight=0)


def test_the_core_imports_no_event_loop_and_no_socket() -> None:
    """h11's rule for the core: no event loop, socket or HTTP in its modules, nor in the
    lmq_client modules they import (``ssl`` may appear: TLS options build a context)."""
    forbidden = {"anyio", "trio", "asyncio", "socket", "select", "urllib", "http"}
    seen: set[Path] = set()
    pending = sorted(CORE.glob("*.py"))
    root = CORE.parent
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in forbidden, f"{path.name} imports {name}"
                if name.startswith("lmq_client."):
                    module = root.parent / (name.replace(".", "/"))
                    candidate = module.with_suffix(".py")
                    pending.append(candidate if candidate.exists() else module / "__init__.py")


def test_a_dpub_delay_is_in_seconds_and_the_old_milliseconds_warn() -> None:
    assert dpub_delay_ms(1.5) == 1500
    assert dpub_delay_ms(2) == 2000  # the async producer: an int is seconds too
    assert dpub_delay_ms(0.0004) == 0
    assert dpub_delay_ms(0, int_is_ms=True) == 0  # 0 is 0 in either unit: no warning
    assert dpub_delay_ms(2.5, int_is_ms=True) == 2500
    with pytest.warns(DeprecationWarning, match=r"dpub\(delay_ms=\) is deprecated: pass delay="):
        assert dpub_delay_ms(None, delay_ms=1500) == 1500
    with pytest.warns(DeprecationWarning, match=r"read as milliseconds .* as a float \(1\.5\)"):
        assert dpub_delay_ms(1500, int_is_ms=True) == 1500
    with pytest.raises(TypeError, match="not both"):
        dpub_delay_ms(1.5, delay_ms=1500)
    with pytest.raises(TypeError, match="needs a delay"):
        dpub_delay_ms(None)
