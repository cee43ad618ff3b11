"""Packages whose public names load their modules on first use (PEP 562).

``lmq_client``, ``lmq_client.core`` and ``lmq_client.spark`` name what their modules hold; a
program that uses one part -- the blocking client, lmqadmin, a Spark worker unpickling a reader
in a fresh process -- imports that part alone, not every front end and anyio with the package.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``homes`` maps each public name to the module
    of the package that holds it, imported (and the name kept in the package) at first use."""

    def get(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return get
