"""A local SparkSession set up the way this project runs Spark (scripts, benchmark, tests).

Loopback only (``SPARK_LOCAL_IP=127.0.0.1``, driver bound to 127.0.0.1), no web UI, few shuffle
partitions, Python workers on this interpreter, and nothing fetched at run time: the session
refuses ``spark.jars.packages`` (the sink is pure Python, and the machines reach no Maven
repository). Java is the one thing Spark needs from the system; ``ensure_java`` checks for it and
can install Debian's ``openjdk-17-jre-headless`` as ``scripts/test`` does.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from lmq_client.spark.datasource import LmqDataSource

__all__ = ["LOCAL_CONF", "ensure_java", "local_session"]

log = logging.getLogger("lmq_client.spark")

LOCAL_CONF: Mapping[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # Spark's default of 200 shuffle partitions is for clusters; on one machine it is 200 tasks
    # of overhead for every shuffle.
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}

JAVA_PACKAGE = "openjdk-17-jre-headless"


def ensure_java(*, install: bool = False) -> None:
    """Return if ``java`` can be run; else install it (``install``, root with apt-get) or raise
    ``RuntimeError`` saying how."""
    if shutil.which("java") or os.environ.get("JAVA_HOME"):
        return
    if install and shutil.which("apt-get") and os.geteuid() == 0:
        log.warning("SPARK: no java found; installing %s", JAVA_PACKAGE)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", JAVA_PACKAGE], check=True, env=env)
        if shutil.which("java"):
            return
    raise RuntimeError(
        f"Spark needs Java 17 and no `java` is on the PATH: install it "
        f"(apt-get install {JAVA_PACKAGE}; ./scripts/test does) or set JAVA_HOME"
    )


def local_session(
    app_name: str = "lmq",
    *,
    master: str = "local[2]",
    conf: Mapping[str, str] | None = None,
    install_java: bool = False,
    log_level: str = "WARN",
) -> SparkSession:
    """A local SparkSession with ``LmqDataSource`` registered (``format("lmq")`` works).

    ``conf`` adds to or overrides ``LOCAL_CONF``. Sets ``SPARK_LOCAL_IP`` and ``PYSPARK_PYTHON``
    (this interpreter) unless already set; they must be in place before the JVM starts.
    """
    settings = {**LOCAL_CONF, **(conf or {})}
    if "spark.jars.packages" in settings:
        raise ValueError("spark.jars.packages would download at run time; the lmq sink needs none")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    ensure_java(install=install_java)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    spark.dataSource.register(LmqDataSource)
    return spark
