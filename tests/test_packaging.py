"""Packaging: what ``pip install .`` gives, what each extra adds, and the set-up scripts' installs.

A base install (no extras) must give a working ``lmqd`` and ``lmqadmin`` without PySpark and
PyArrow; ``import lmq_client.spark`` must then fail with an ImportError that names the extra.
Installing for real from PyPI takes a minute and ~40 MB of downloads, too slow for every run
(docs/operations.md reports one done by hand), so these tests prove it in three cheaper parts:

- the declared dependencies match the imports, both ways: every third-party module that lmqd and
  lmq_client import (anywhere, also inside functions) comes from a core dependency, the spark
  package adds only the spark extra, and every declared dependency is imported (item 5 of
  issue 11: nothing declared and never used);
- the wheel built from the tree (offline: ``pip wheel --no-build-isolation`` with the test
  extra's setuptools) requires PySpark and PyArrow only under ``extra == "spark"``, ships
  ``py.typed`` for both packages and the two console scripts;
- a subprocess that sees only what a base install would: a meta-path finder refuses every
  installed distribution outside the closure of the wheel's base requirements (PySpark, PyArrow,
  py4j, the test tools...). In it every module of lmqd and lmq_client imports, the console
  scripts' entry points answer ``--version``/``--help``, and ``import lmq_client.spark`` raises
  the ImportError naming ``pip install 'lmq[spark]'``.

scripts/_env.sh is run against a fake virtualenv whose python logs pip's command lines instead of
running pip, to check that installs are incremental. Rules for this module: no network (the
wheel is built without build isolation and without an index), every subprocess has a timeout,
everything is written under pytest's tmp_path.
"""

from __future__ import annotations

import ast
import email.parser
import email.policy
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name

from lmqd.cli import VERSION_LINE

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SPARK_PACKAGE = ROOT / "lmq_client" / "spark"
# The top-level modules only the spark extra brings (py4j is PySpark's dependency).
SPARK_MODULES = frozenset({"pyspark", "pyarrow", "py4j"})
# Dependencies of the test extra that no test imports, and why they are there.
TEST_TOOLS = {
    "ruff": "lint, run by scripts/test",
    "mypy": "type checks, run by scripts/test",
    "pytest-trio": "the pytest plugin behind trio_mode",
    "setuptools": "the build backend this module builds the wheel with, offline",
    "python-snappy": "pynsq's and gnsq's snappy sockets import it (tests/interop, secure)",
}
# Building a wheel of this small tree takes ~1.5 s; a loaded 2-core box may take many times that.
BUILD_TIMEOUT_S = 120.0
# A child that imports every module of lmqd and lmq_client: ~1 s.
CHILD_TIMEOUT_S = 60.0


def _names(requirements: Iterable[str]) -> set[NormalizedName]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


CORE = _names(PYPROJECT["project"]["dependencies"])
EXTRAS = {
    extra: _names(reqs) for extra, reqs in PYPROJECT["project"]["optional-dependencies"].items()
}


# -- the imports against the declared dependencies -----------------------------------------------


def _python_files(*roots: Path, skip: Path | None = None) -> list[Path]:
    files = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if skip is None or not path.is_relative_to(skip):
                files.append(path)
    return files


def _first_party() -> set[str]:
    """Names importable from the repository itself: the packages and the tests' helpers."""
    names = {"lmqd", "lmq_client", "tests", "scripts"}
    for area in (ROOT / "tests", ROOT / "scripts"):
        names.update(p.stem for p in area.rglob("*.py"))
        names.update(p.name for p in area.rglob("*") if p.is_dir())
    return names


def _third_party_imports(files: Iterable[Path]) -> dict[str, list[str]]:
    """Top-level module imported -> the files importing it, for modules neither stdlib nor ours."""
    ours = _first_party()
    found: dict[str, list[str]] = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
            if isinstance(node, ast.Import):
                tops = [alias.name.partition(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                tops = [node.module.partition(".")[0]]
            else:
                continue
            for top in tops:
                if top not in sys.stdlib_module_names and top not in ours:
                    found.setdefault(top, []).append(str(path.relative_to(ROOT)))
    return found


def _distributions(module: str) -> set[NormalizedName]:
    """The distributions that provide a top-level module (the module's own name when none of the
    installed ones does, which is right for the dependencies whose module and project names match,
    e.g. pyspark in an environment without the spark extra)."""
    provided = importlib.metadata.packages_distributions().get(module, [module])
    return {canonicalize_name(d) for d in provided}


def _undeclared(
    imports: dict[str, list[str]], allowed: set[NormalizedName]
) -> dict[str, list[str]]:
    return {m: files for m, files in imports.items() if not _distributions(m) & allowed}


def _imported_distributions(imports: dict[str, list[str]]) -> set[NormalizedName]:
    return set().union(*(_distributions(m) for m in imports))


def test_the_daemon_clients_and_lmqadmin_import_only_core_dependencies() -> None:
    imports = _third_party_imports(
        _python_files(ROOT / "lmqd", ROOT / "lmq_client", skip=SPARK_PACKAGE)
    )
    assert _undeclared(imports, CORE) == {}


def test_every_core_dependency_is_imported_by_the_daemon_clients_or_lmqadmin() -> None:
    imports = _third_party_imports(
        _python_files(ROOT / "lmqd", ROOT / "lmq_client", skip=SPARK_PACKAGE)
    )
    assert CORE - _imported_distributions(imports) == set()


def test_at_rest_codecs_are_core_dependencies() -> None:
    """Compression and encryption at rest (lmqd.storage.atrest) need no extra: a daemon
    started with --encryption-key-file must never find its cipher missing."""
    assert {"cramjam", "cryptography"} <= CORE
    assert not any("cryptography" in names for names in EXTRAS.values())


def test_the_spark_package_adds_exactly_the_spark_extra() -> None:
    imports = _third_party_imports(_python_files(SPARK_PACKAGE))
    assert _undeclared(imports, CORE | EXTRAS["spark"]) == {}
    assert EXTRAS["spark"] - _imported_distributions(imports) == set()
    assert EXTRAS["spark"] == {"pyspark", "pyarrow"}
    assert not EXTRAS["spark"] & CORE


def test_tests_and_scripts_import_only_declared_dependencies() -> None:
    imports = _third_party_imports(_python_files(ROOT / "tests", ROOT / "scripts"))
    everything = CORE.union(*EXTRAS.values())
    assert _undeclared(imports, everything) == {}
    unused = EXTRAS["test"] - _imported_distributions(imports) - set(TEST_TOOLS)
    assert unused == set()


# -- the wheel ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    """The wheel ``pip install .`` would install, built from a copy of the tree (a build writes
    build/ and *.egg-info/ next to the sources, which must not land in the worktree)."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for package in ("lmqd", "lmq_client"):
        shutil.copytree(
            ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    command = [
        sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
        "--disable-pip-version-check", "-q", "-w", str(work / "dist"), str(src),
    ]  # fmt: skip
    built = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert built.returncode == 0, (
        f"wheel build failed (is the test extra installed?):\n{built.stderr}"
    )
    [path] = (work / "dist").glob("lmq-*.whl")
    with zipfile.ZipFile(path) as archive:
        yield archive


def _dist_info(wheel: zipfile.ZipFile, name: str) -> str:
    [path] = [n for n in wheel.namelist() if n.endswith(f".dist-info/{name}")]
    return wheel.read(path).decode()


def _wheel_requirements(wheel: zipfile.ZipFile) -> list[Requirement]:
    metadata = email.parser.Parser(policy=email.policy.compat32).parsestr(
        _dist_info(wheel, "METADATA")
    )
    return [Requirement(line) for line in metadata.get_all("Requires-Dist") or []]


def _base_requirements(wheel: zipfile.ZipFile) -> list[Requirement]:
    """What ``pip install lmq`` (no extras) installs directly: requirements whose marker holds
    without an extra."""
    return [
        r
        for r in _wheel_requirements(wheel)
        if r.marker is None or r.marker.evaluate({"extra": ""})
    ]


def _requirements_under_extra(wheel: zipfile.ZipFile, extra: str) -> set[NormalizedName]:
    """What the extra adds to a base install."""
    return {
        canonicalize_name(r.name)
        for r in _wheel_requirements(wheel)
        if r.marker is not None
        and r.marker.evaluate({"extra": extra})
        and not r.marker.evaluate({"extra": ""})
    }


def test_the_wheel_requires_pyspark_and_pyarrow_only_for_the_spark_extra(
    wheel: zipfile.ZipFile,
) -> None:
    base = {canonicalize_name(r.name) for r in _base_requirements(wheel)}
    assert base == CORE
    assert not base & {"pyspark", "pyarrow", "py4j"}
    assert _requirements_under_extra(wheel, "spark") == {"pyspark", "pyarrow"}


def test_the_wheel_ships_both_packages_typed_with_their_console_scripts(
    wheel: zipfile.ZipFile,
) -> None:
    names = set(wheel.namelist())
    assert {"lmqd/py.typed", "lmq_client/py.typed"} <= names
    assert {"lmqd/__init__.py", "lmq_client/__init__.py", "lmq_client/spark/__init__.py"} <= names
    packages = {
        n.partition("/")[0] for n in names if not n.partition("/")[0].endswith(".dist-info")
    }
    assert packages == {"lmqd", "lmq_client"}
    assert _console_scripts(wheel) == {
        "lmqd": "lmqd.cli:main",
        "lmqadmin": "lmq_client.admin.cli:main",
        "lmqlookupd": "lmqd.lookupd.cli:main",
    }


def test_the_wheel_ships_the_consoles_templates_and_static_files(
    wheel: zipfile.ZipFile,
) -> None:
    """``lmqadmin web`` works offline from the wheel alone: every template and static file of
    the source tree (htmx, uPlot and their licences included) is in it, byte for byte."""
    web = ROOT / "lmq_client" / "admin" / "web"
    names = set(wheel.namelist())
    for folder in ("templates", "static"):
        files = sorted(p for p in (web / folder).iterdir() if p.is_file())
        assert files, folder
        for path in files:
            name = path.relative_to(ROOT).as_posix()
            assert name in names, f"{name} is not in the wheel"
            assert wheel.read(name) == path.read_bytes(), name


def _console_scripts(wheel: zipfile.ZipFile) -> dict[str, str]:
    scripts = {}
    section = ""
    for raw in _dist_info(wheel, "entry_points.txt").splitlines():
        line = raw.strip()
        if line.startswith("["):
            section = line.strip("[]")
        elif line and section == "console_scripts":
            name, _, target = line.partition("=")
            scripts[name.strip()] = target.strip()
    return scripts


# -- a base install, simulated --------------------------------------------------------------------


def _base_closure(requirements: Iterable[Requirement]) -> set[NormalizedName]:
    """lmq and every distribution a base install pulls in, following the installed metadata."""
    closure: set[NormalizedName] = {canonicalize_name("lmq")}
    todo = list(requirements)
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if name in closure:
            continue
        closure.add(name)
        extras = {"", *requirement.extras}
        for line in importlib.metadata.distribution(name).requires or []:
            needed = Requirement(line)
            marker: Marker | None = needed.marker
            if marker is None or any(marker.evaluate({"extra": e}) for e in extras):
                todo.append(needed)
    return closure


# Runs first in the child: every installed distribution outside LMQ_BASE_DISTS is "not installed".
_CHILD_PRELUDE = """
import importlib, importlib.metadata, json, os, re, sys

def _canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()

_base = set(json.loads(os.environ["LMQ_BASE_DISTS"]))
_absent = {
    module
    for module, dists in importlib.metadata.packages_distributions().items()
    if not any(_canonical(d) in _base for d in dists)
}

class _NotInBaseInstall:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.partition(".")[0] in _absent:
            message = f"No module named {name!r} (not in a base install)"
            raise ModuleNotFoundError(message, name=name)
        return None

sys.meta_path.insert(0, _NotInBaseInstall)
"""


@pytest.fixture(scope="module")
def base_dists(wheel: zipfile.ZipFile) -> set[NormalizedName]:
    closure = _base_closure(_base_requirements(wheel))
    assert not closure & {"pyspark", "pyarrow", "py4j"}
    return closure


def _in_base_install(
    base_dists: set[NormalizedName], code: str, *args: str
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "LMQ_BASE_DISTS": json.dumps(sorted(base_dists)),
    }
    return subprocess.run(
        [sys.executable, "-c", _CHILD_PRELUDE + code, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=CHILD_TIMEOUT_S,
    )


def _modules(package: str) -> list[str]:
    """Every module of a package except the spark package and ``__main__`` (which runs)."""
    modules = []
    for path in _python_files(ROOT / package, skip=SPARK_PACKAGE):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__main__":
            continue
        if parts[-1] == "__init__":
            parts.pop()
        modules.append(".".join(parts))
    return modules


def test_every_module_but_spark_imports_in_a_base_install(base_dists: set[NormalizedName]) -> None:
    modules = _modules("lmqd") + _modules("lmq_client")
    assert "lmqd.service" in modules and "lmq_client.admin.bench" in modules
    child = _in_base_install(
        base_dists,
        "for m in sys.argv[1:]: importlib.import_module(m)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.partition('.')[0] in _absent)))",
        *modules,
    )
    assert child.returncode == 0, child.stderr
    # Only what was already loaded before the finder went in (the site hooks) may be there.
    assert not {m.partition(".")[0] for m in json.loads(child.stdout)} & SPARK_MODULES


@pytest.mark.parametrize(
    ("script", "args", "expected"),
    [
        ("lmqd", ["--version"], VERSION_LINE),
        ("lmqd", ["--help"], "--tcp-address"),
        ("lmqadmin", ["--help"], "Usage: lmqadmin"),
        ("lmqadmin", ["bench", "--help"], "Usage: lmqadmin bench"),
    ],
)
def test_the_console_scripts_work_in_a_base_install(
    wheel: zipfile.ZipFile,
    base_dists: set[NormalizedName],
    script: str,
    args: list[str],
    expected: str,
) -> None:
    module, _, function = _console_scripts(wheel)[script].partition(":")
    child = _in_base_install(
        base_dists,
        f"sys.argv = [{script!r}, *sys.argv[1:]]\n"
        f"sys.exit(getattr(importlib.import_module({module!r}), {function!r})())",
        *args,
    )
    assert (child.returncode, child.stderr) == (0, "")
    assert expected in child.stdout


def test_import_lmq_client_spark_in_a_base_install_names_the_extra(
    base_dists: set[NormalizedName],
) -> None:
    child = _in_base_install(
        base_dists,
        "try:\n"
        "    import lmq_client.spark\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc.name, exc, sep='|')\n"
        "else:\n"
        "    sys.exit('imported')",
    )
    assert child.returncode == 0, child.stderr
    kind, name, message = child.stdout.strip().split("|")
    assert kind == "ModuleNotFoundError"
    assert name.partition(".")[0] in SPARK_MODULES
    assert "pip install 'lmq[spark]'" in message


def test_import_lmq_client_spark_works_with_the_extra() -> None:
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    pytest.importorskip("pyarrow", reason="the spark extra is not installed")
    import lmq_client.spark

    assert lmq_client.spark.LmqDataSource.name() == "lmq"


@pytest.mark.parametrize(
    ("module", "absent"),
    [
        ("lmq_client.sync", {"anyio", "lmq_client.consumer", "lmq_client.producer"}),
        ("lmq_client.spark.source", {"anyio", "lmq_client.spark.publish", "lmq_client.sync"}),
        ("lmq_client.spark.publish", {"anyio", "lmq_client.spark.source"}),
        ("lmq_client.spark.sink", {"anyio", "lmq_client.spark.source", "lmq_client.spark.nodes"}),
        (
            "lmq_client.spark.datasource",
            {"lmq_client.spark.publish", "lmq_client.spark.source", "lmq_client.transport"},
        ),
        ("lmq_client.spark.source_options", {"lmq_client.spark.options", "lmq_client.transport"}),
    ],
)
def test_one_part_of_the_client_imports_that_part_alone(module: str, absent: set[str]) -> None:
    """The packages' names load on first use (``lmq_client._lazy``): the blocking client does
    not import the async front ends, and a Spark worker unpickling the data source or a reader
    (a fresh process per query and per micro-batch) does not import the sink's modules, nor the
    reverse."""
    if module.startswith("lmq_client.spark"):
        pytest.importorskip("pyspark", reason="the spark extra is not installed")
    script = f"import sys, {module}; print(sorted(set(sys.modules) & {absent!r}))"
    child = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert (child.returncode, child.stderr) == (0, "")
    assert child.stdout.strip() == "[]"


# -- scripts/_env.sh ------------------------------------------------------------------------------


class FakeCheckout:
    """A copy of scripts/_env.sh and pyproject.toml with a .venv whose python records pip's
    command lines (and does nothing else) but runs everything else with the real interpreter."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pip_log = root / "pip.log"
        (root / "scripts").mkdir(parents=True)
        shutil.copy2(ROOT / "scripts" / "_env.sh", root / "scripts" / "_env.sh")
        shutil.copy2(ROOT / "pyproject.toml", root / "pyproject.toml")
        python = root / ".venv" / "bin" / "python"
        python.parent.mkdir(parents=True)
        python.write_text(
            "#!/bin/sh\n"
            'if [ "$1" = -m ] && [ "$2" = pip ]; then\n'
            f'    shift 2; echo "$*" >> {str(self.pip_log)!r}; exit 0\n'
            "fi\n"
            f'exec {sys.executable!r} "$@"\n'
        )
        python.chmod(0o755)

    def setup(self, extras: str) -> list[str]:
        """Source _env.sh as a script does with LMQ_EXTRAS=extras; return the pip commands run."""
        self.pip_log.write_text("")
        script = f"LMQ_EXTRAS={extras!r}\nsource {str(self.root / 'scripts' / '_env.sh')!r}\n"
        done = subprocess.run(
            ["bash", "-c", script], capture_output=True, text=True, timeout=CHILD_TIMEOUT_S
        )
        assert done.returncode == 0, done.stderr
        return self.pip_log.read_text().splitlines()

    def install(self, extras: str = "") -> str:
        target = f"{self.root}[{extras}]" if extras else str(self.root)
        return f"install -q --disable-pip-version-check -e {target}"


@pytest.fixture
def checkout(tmp_path: Path) -> FakeCheckout:
    return FakeCheckout(tmp_path / "lmq")


def test_run_after_test_installs_nothing(checkout: FakeCheckout) -> None:
    assert checkout.setup("spark,test") == [checkout.install("spark,test")]
    assert checkout.setup("") == []
    assert checkout.setup("test") == []
    assert checkout.setup("spark,test") == []


def test_test_after_run_adds_the_extras_without_upgrading(checkout: FakeCheckout) -> None:
    assert checkout.setup("") == [checkout.install()]
    assert checkout.setup("") == []
    # pip without -U leaves the base requirements, already satisfied, as they are.
    assert checkout.setup("spark,test") == [checkout.install("spark,test")]
    assert checkout.setup("") == []


def test_extras_accumulate_in_any_order(checkout: FakeCheckout) -> None:
    assert checkout.setup("test") == [checkout.install("test")]
    assert checkout.setup("spark") == [checkout.install("spark,test")]
    assert checkout.setup("test,spark") == []


def test_a_changed_pyproject_reinstalls_with_the_extras_already_there(
    checkout: FakeCheckout,
) -> None:
    assert checkout.setup("spark,test") == [checkout.install("spark,test")]
    with (checkout.root / "pyproject.toml").open("a") as f:
        f.write("\n# a change\n")
    assert checkout.setup("") == [checkout.install("spark,test")]
    assert checkout.setup("") == []


def test_an_unknown_extra_is_refused(checkout: FakeCheckout) -> None:
    script = f"LMQ_EXTRAS=sprak\nsource {str(checkout.root / 'scripts' / '_env.sh')!r}\n"
    done = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=CHILD_TIMEOUT_S
    )
    assert done.returncode != 0
    assert "no extra named sprak" in done.stderr
    assert not checkout.pip_log.exists()
