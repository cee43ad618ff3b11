"""lmqd's import graph: no cycle, and no import from a lower layer to a higher one.

The layers (docs/architecture.md, "The house"), lowest first::

    root      lmqd (the package root: versions), units, message_ext (a message's extension
              fields and their byte form)
    leaves    net, names, positions, message, options, stats, gohttp, memory
    settings  config, logging_setup                   flags, TOML, nsqd's log format
    codecs    protocol, storage, lookup               sans-IO / trio-free codecs and storage
    engine    engine, transport                       queue logic on plain def; TLS, compression
                                                      and AUTH around the V2 codec
    broker    broker                                  what the network layers call
    mirror    mirror                                  replication: a primary's mirrors, a
                                                      mirror's follower, promotion
    metrics   metrics                                 the Prometheus collector over the broker
    network   server, httpapi, lookupd, registration, statsd_push
                                                      I/O around the broker (lookupd: lmqlookupd;
                                                      registration: lmqd's, with the lookupds)
    service   service                                 runs everything
    entry     cli, then __main__

A module may import its own package and any lower layer. Every import counts, including those
inside functions and under ``TYPE_CHECKING``: a layer that needs a name from above has its seam in
the wrong place. The graph is read from the source with ``ast`` (nothing is imported), so the test
also sees modules no other test imports.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "lmqd"

LAYERS: dict[str, int] = {
    **dict.fromkeys(("", "units", "message_ext"), 0),
    **dict.fromkeys(
        ("net", "names", "positions", "message", "options", "stats", "gohttp", "memory"), 1
    ),
    **dict.fromkeys(("config", "logging_setup"), 2),
    **dict.fromkeys(("protocol", "storage", "lookup"), 3),
    **dict.fromkeys(("engine", "transport"), 4),
    "broker": 5,
    "mirror": 6,
    "metrics": 7,
    **dict.fromkeys(("server", "httpapi", "lookupd", "registration", "statsd_push"), 8),
    "service": 9,
    "cli": 10,
    "__main__": 11,
}


def _unit(module: str) -> str:
    """``lmqd.engine.channel`` -> ``engine``; ``lmqd`` -> ``""`` (the package root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, module: str) -> set[str]:
    """Every ``lmqd...`` module ``path`` imports (absolute and relative, anywhere in the file)."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            # ``from lmqd.engine import channel`` imports the submodule lmqd.engine.channel
            # (Python runs the package's __init__ first, as for any submodule: that is no edge).
            names_only = False
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                if (ROOT / Path(*candidate.split("."))).with_suffix(".py").exists():
                    found.add(candidate)
                else:
                    names_only = True
            if names_only:
                found.add(target)
    return {name for name in found if name == "lmqd" or name.startswith("lmqd.")}


def _graph() -> dict[str, set[str]]:
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        graph[module] = _imports(path, module) - {module}
    return graph


def test_every_unit_has_a_layer() -> None:
    units = {_unit(m) for m in _graph()}
    missing = units - set(LAYERS)
    assert not missing, f"modules with no layer (add them to LAYERS): {missing}"


def test_no_import_goes_up_or_sideways() -> None:
    wrong = []
    for module, targets in _graph().items():
        source = _unit(module)
        for target in targets:
            dest = _unit(target)
            if dest == source:
                continue
            if LAYERS[dest] >= LAYERS[source] and source != "":
                wrong.append(f"{module} -> {target} (layer {LAYERS[source]} -> {LAYERS[dest]})")
            if source == "" and dest != "":
                wrong.append(f"{module} -> {target} (the package root imports nothing of lmqd)")
    assert not wrong, "imports against the layering:\n" + "\n".join(sorted(wrong))


def test_no_import_cycle() -> None:
    graph = _graph()
    # Tarjan's strongly connected components: any component of two or more modules is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in graph:
                continue
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in graph:
        if node not in index:
            visit(node)
    assert not cycles, f"import cycles: {cycles}"


@pytest.mark.parametrize("package", ["lmqd.protocol", "lmqd.storage"])
def test_codecs_do_not_import_trio(package: str) -> None:
    code = f"import sys, {package}; sys.exit('trio' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_a_daemon_that_encrypts_nothing_never_loads_cryptography() -> None:
    """The common case pays nothing for encryption at rest: ``cryptography`` (~7 MB of memory)
    is imported by the first keyring, not by the daemon's modules."""
    code = (
        "import sys, lmqd.service, lmqd.cli; loaded = 'cryptography' in sys.modules\n"
        "from lmqd.storage.atrest.keys import Keyring; Keyring([bytes(32)])\n"
        "sys.exit(2 * loaded + ('cryptography' not in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_the_checker_sees_a_cycle_and_an_upward_import() -> None:
    """The rules above would catch a violation (guards the test against reading nothing)."""
    graph = _graph()
    assert "lmqd.engine.channel" in graph["lmqd.engine.topic"]
    assert "lmqd.broker" in graph["lmqd.server.session"]
    assert LAYERS[_unit("lmqd.server.session")] > LAYERS[_unit("lmqd.broker")]
