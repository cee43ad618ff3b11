"""Issue 29's limits for the client's front ends and core: no class over 300 lines and no module
over 500 in ``lmq_client``, outside ``admin/`` and ``spark/`` (which have their own, the project's
600 and 800). Read with ``ast``, nothing imported.

Rules for this module: no I/O but reading the package's source.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "lmq_client"
EXEMPT = ("admin", "spark")
MAX_CLASS_LINES = 300
MAX_MODULE_LINES = 500


def _modules() -> list[Path]:
    return [path for path in sorted(PACKAGE.rglob("*.py"))
            if path.relative_to(PACKAGE).parts[0] not in EXEMPT]  # fmt: skip


def test_no_module_of_the_client_core_and_front_ends_is_over_500_lines() -> None:
    sizes = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in _modules()}
    assert sizes  # the walk found the package
    assert {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES} == {}


def test_no_class_of_the_client_core_and_front_ends_is_over_300_lines() -> None:
    too_big = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    too_big[f"{path.relative_to(PACKAGE)}:{node.name}"] = lines
    assert too_big == {}
