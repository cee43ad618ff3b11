"""stub"""

from __future__ import annotations

from typing import Any


def register(console: Any) -> None:
    pass
