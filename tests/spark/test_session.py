"""local_session / ensure_java: the checks that run before any JVM starts (no Spark needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmq_client.spark import ensure_java, local_session


def test_ensure_java_says_what_to_install_when_there_is_none(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # a directory without java (or apt-get)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(RuntimeError) as info:
        ensure_java(install=True)
    assert str(info.value) == (
        "Spark needs Java 17 and no `java` is on the PATH: install it (apt-get install "
        "openjdk-17-jre-headless; ./scripts/test does) or set JAVA_HOME"
    )


def test_ensure_java_accepts_java_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("JAVA_HOME", "/opt/jdk")
    ensure_java()


def test_local_session_refuses_downloads_at_run_time() -> None:
    with pytest.raises(ValueError, match=r"^spark\.jars\.packages would download at run time"):
        local_session(conf={"spark.jars.packages": "org.example:thing:1.0"})
