"""The example pipeline (scripts/spark_pipeline.py) on the shared Spark session and daemon.

Same rules as test_sink.py: 127.0.0.1 only, a topic per test, bounded Spark jobs and waits.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

from pyspark.sql import SparkSession

from tests.support.process import LmqdProcess

from .conftest import receive, spark_guard, write_lines

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "spark_pipeline.py"


def _load_pipeline() -> ModuleType:
    spec = importlib.util.spec_from_file_location("spark_pipeline", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("spark_pipeline", module)
    spec.loader.exec_module(module)
    return module


def test_pipeline_publishes_valid_orders_enriched(
    spark: SparkSession, daemon: LmqdProcess, topic: str, tmp_path: Path
) -> None:
    pipeline = _load_pipeline()
    orders = [
        {"order_id": "o1", "customer": "ada", "amount": 100.0, "currency": "USD",
         "created_at": "2026-01-02T03:04:05Z"},
        {"order_id": "o2", "customer": None, "amount": 10.0, "currency": "EUR",
         "created_at": "2026-01-02T03:04:05Z"},
        {"order_id": "o3", "customer": "grace", "amount": -5.0, "currency": "EUR",
         "created_at": "2026-01-02T03:04:05Z"},
        {"order_id": "o4", "customer": "linus", "amount": 500.0, "currency": "GBP",
         "created_at": "2026-01-02T03:04:05Z"},
    ]
    write_lines(tmp_path / "in", "orders-1.jsonl", [json.dumps(o) for o in orders])
    with spark_guard(spark):
        query = pipeline.start_pipeline(
            spark, source=tmp_path / "in", checkpoint=tmp_path / "checkpoint",
            address=daemon.tcp_address, topic=topic,
        )
        assert query.awaitTermination(60)
    received = {m["order_id"]: m for m in map(json.loads, receive(daemon.tcp_address, topic, 2))}
    assert set(received) == {"o1", "o4"}  # no customer, or amount <= 0: dropped
    assert (received["o1"]["amount_eur"], received["o1"]["big"]) == (92.0, False)
    assert (received["o4"]["amount_eur"], received["o4"]["big"]) == (585.0, True)
    assert received["o4"]["customer"] == "linus" and received["o4"]["currency"] == "GBP"
    assert received["o4"]["created_at"].startswith("2026-01-02T")


def test_demo_orders_are_one_complete_visible_file(tmp_path: Path) -> None:
    pipeline = _load_pipeline()
    pipeline.write_demo_orders(tmp_path / "in", 25)
    [written] = list((tmp_path / "in").iterdir())  # no hidden temporary file left behind
    assert written.name.startswith("orders-") and written.suffix == ".jsonl"
    orders = [json.loads(line) for line in written.read_text().splitlines()]
    assert len(orders) == 25
    assert set(orders[0]) == {"order_id", "customer", "amount", "currency", "created_at"}
