"""What the sink's and the source's options share: names by their canonical spelling, booleans
and lists, each refused in one line naming the option (``options.py``, ``source_options.py``).

Its own module so that either side's options import nothing of the other's: a Spark worker that
reads never loads the sink's transport (TLS, compression), nor one that writes the source's.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["SPARK_OWN", "bool_option", "canonical_options", "split_list"]

SPARK_OWN = frozenset({"checkpointLocation", "path"})
"""Options Spark passes to a data source beside the user's (not listed as known in errors)."""


def canonical_options(
    options: Mapping[str, str], known: Mapping[str, str], who: str
) -> dict[str, str]:
    """``options`` by their canonical names (``known`` maps lower-case names to them; Spark
    lower-cases option keys); ``ValueError`` naming an unknown one and the known ones."""
    given: dict[str, str] = {}
    for key, value in options.items():
        canonical = known.get(key.lower())
        if canonical is None:
            names = ", ".join(sorted(v for v in known.values() if v not in SPARK_OWN))
            raise ValueError(f"lmq {who}: unknown option {key!r} (known: {names})")
        given[canonical] = value
    return given


def bool_option(
    given: Mapping[str, str], name: str, *, default: bool = False, who: str = "sink"
) -> bool:
    """Option ``name`` as ``true``/``false`` (any case; ``default`` when not given);
    ``ValueError`` naming it otherwise (``who``: the sink or the source)."""
    raw = given.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"lmq {who}: option {name!r} must be true or false, not {raw!r}")
    return value == "true"


def split_list(value: str) -> list[str]:
    """A comma-separated option's items, stripped, empty ones dropped."""
    return [a.strip() for a in value.split(",") if a.strip()]
