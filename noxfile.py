"""Developer tasks: ``nox -s tests``, ``nox -s lint``, ``nox -s typecheck``, ``nox -s docs``,
``nox -s matrix`` (the version matrix), ``nox -s build`` (sdist, wheel, twine check) and
``nox -s mutants`` (each promise broken on purpose must fail its tests; see tests/mutants).

Arguments after ``--`` go to pytest, e.g. ``nox -s tests -- -m unit -x``.

These sessions are the one definition of the checks: which paths are linted, and with
which tools. The tool pins are those of pyproject.toml's extras (ruff's is read from the
``lint`` extra below). CI (``.ci/run``) runs the lint, typecheck and docs sessions inside
its own fresh virtualenv (``--no-venv --no-install``, the ``dev`` extra installed), so it
names neither paths nor pins; then it runs ``matrix`` in virtualenvs of its own.

The version matrix
------------------

Three factors: Python 3.11, 3.12 and 3.13; SQLAlchemy at the lowest supported 2.0.x and at
the latest release; Alembic at the lowest supported release and at the latest. The lowest
versions are read from ``pyproject.toml``'s ``dependencies`` (``sqlalchemy>=X``,
``alembic>=Y``) and installed exactly (``==X``), so the bound there is what gets tested;
"latest" is whatever the index has newest when the cell runs.

The full cross product is 12 cells. One of them, the newest SQLAlchemy and Alembic on CI's
Python (3.11, the lowest supported, which mypy also targets), runs the whole suite: that is
``.ci/run``'s own ``python -m pytest -q`` in its virtualenv (``nox -s tests`` here). A fast
subset (``FAST_TESTS``: unit, migration, and the integration enqueue, claim and worker
tests, about 1.5 minutes) runs on each other cell; eleven of them would take some 20
minutes of a CI run that must stay under 30 on two cores next to the 10-minute full suite.

So ``MATRIX`` is a covering set instead: with the full-suite cell, every pair of values of
any two factors runs together at least once (every Python with the lowest and the latest
SQLAlchemy, every Python with the lowest and the latest Alembic, and all four SQLAlchemy x
Alembic pairs), and the two corners that break most often are both in: all lowest on the
oldest and on the newest Python, all latest on the newest Python.

    cell                                      Python  SQLAlchemy  Alembic  tests
    .ci/run's own venv (here: nox -s tests)   3.11    latest      latest   whole suite
    py3.11-sqlalchemy_lowest-alembic_lowest   3.11    lowest      lowest   FAST_TESTS
    py3.12-sqlalchemy_lowest-alembic_latest   3.12    lowest      latest   FAST_TESTS
    py3.12-sqlalchemy_latest-alembic_lowest   3.12    latest      lowest   FAST_TESTS
    py3.13-sqlalchemy_latest-alembic_latest   3.13    latest      latest   FAST_TESTS
    py3.13-sqlalchemy_lowest-alembic_lowest   3.13    lowest      lowest   FAST_TESTS

(The first row's Python is CI's ``python3``, 3.11 on this project's machines; ``.ci/run``
and every cell print the versions they ran.)

Run one cell with ``nox -s "matrix(py3.12-sqlalchemy_lowest-alembic_latest)"``; ``nox -l``
lists them. Interpreters are found on ``PATH`` (``python3.12``) or, where pyenv's shims do
not serve that version, among pyenv's installed versions.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"
# Only interpreters on this machine: never download one (an option of nox 2025 and later).
if hasattr(nox.options, "download_python"):
    nox.options.download_python = "never"
# `nox` alone runs the checks of a change, not the slower matrix and build.
nox.options.sessions = ["lint", "typecheck", "docs", "tests"]

ROOT = Path(__file__).parent
LINT_PATHS = (
    "sqla_queue",
    "alembic_ext",
    "tests",
    "examples",
    "bench",
    ".ci",
    "docs/_hooks",
    "noxfile.py",
)

#: What every matrix cell runs: the tests a version difference breaks first.
FAST_TESTS = (
    "tests/unit",
    "tests/migration",
    "tests/integration/test_enqueue.py",
    "tests/integration/test_claim.py",
    "tests/integration/test_worker.py",
)


def _project() -> dict[str, Any]:
    """pyproject.toml's ``[project]`` table."""
    with (ROOT / "pyproject.toml").open("rb") as file:
        project: dict[str, Any] = tomllib.load(file)["project"]
    return project


def _extra(name: str) -> list[str]:
    """The requirements of one of pyproject.toml's extras."""
    requirements: list[str] = _project()["optional-dependencies"][name]
    return requirements


def _lowest(distribution: str) -> str:
    """The lower bound that pyproject.toml's dependencies give ``distribution``."""
    for requirement in _project()["dependencies"]:
        match = re.fullmatch(rf"{distribution}\s*>=\s*([0-9][0-9a-z.]*)", requirement, re.I)
        if match:
            return match.group(1)
    raise LookupError(f"pyproject.toml has no `{distribution}>=X` dependency")


# ruff's pin lives in the `lint` extra, which the `dev` extra (and so CI) installs too.
RUFF = next(req for req in _extra("lint") if req.startswith("ruff"))


def _lint_paths() -> list[str]:
    # Git does not keep empty directories, so some of these may be missing in a fresh clone,
    # and ruff fails on paths that do not exist.
    return [path for path in LINT_PATHS if (ROOT / path).exists()]


def _interpreter(version: str) -> str:
    """An interpreter for Python ``version`` ("3.12"), as a path nox can use.

    ``pythonX.Y`` on ``PATH`` if it runs (a pyenv shim of a version that is not selected
    fails), else the newest ``X.Y.*`` among pyenv's versions, else ``version`` itself, which
    nox reports as a missing interpreter.
    """
    found = shutil.which(f"python{version}")
    if found:
        probe = subprocess.run(
            [found, "-c", "import sys; print(sys.executable)"],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode == 0 and probe.stdout.strip():
            return probe.stdout.strip()
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = [
        path / "bin" / f"python{version}"
        for path in root.glob(f"{version}.*")
        if re.fullmatch(rf"{re.escape(version)}\.\d+", path.name)
    ]
    candidates = [path for path in candidates if os.access(path, os.X_OK)]
    if candidates:
        newest = max(candidates, key=lambda path: int(path.parent.parent.name.split(".")[-1]))
        return str(newest)
    return version


LOWEST, LATEST = "lowest", "latest"
# (Python, SQLAlchemy, Alembic): see "The version matrix" above for why these five.
MATRIX = (
    ("3.11", LOWEST, LOWEST),
    ("3.12", LOWEST, LATEST),
    ("3.12", LATEST, LOWEST),
    ("3.13", LATEST, LATEST),
    ("3.13", LOWEST, LOWEST),
)


def _requirement(distribution: str, level: str) -> str:
    return f"{distribution}=={_lowest(distribution)}" if level == LOWEST else distribution


@nox.session
@nox.parametrize(
    "python,sqlalchemy,alembic",
    [
        nox.param(
            _interpreter(python),
            sqlalchemy,
            alembic,
            id=f"py{python}-sqlalchemy_{sqlalchemy}-alembic_{alembic}",
        )
        for python, sqlalchemy, alembic in MATRIX
    ],
)
def matrix(session: nox.Session, sqlalchemy: str, alembic: str) -> None:
    """One cell of the version matrix: the fast test subset (or ``-- ARGS`` for pytest)."""
    # --upgrade: a reused virtualenv moves to the newest releases too, like a fresh one.
    session.install(
        "--upgrade",
        "-e",
        ".[test]",
        _requirement("sqlalchemy", sqlalchemy),
        _requirement("alembic", alembic),
    )
    session.run(
        "python",
        "-c",
        "import platform, sqlalchemy, alembic; print('cell: Python', "
        "platform.python_version(), '| SQLAlchemy', sqlalchemy.__version__, "
        "'| Alembic', alembic.__version__)",
    )
    session.run("python", "-m", "pytest", "-q", *(session.posargs or FAST_TESTS))


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite; needs PostgreSQL or falls back to the embedded server."""
    session.install("-e", ".[test]")
    session.run("pytest", *session.posargs)


@nox.session
def mutants(session: nox.Session) -> None:
    """Break each promise on purpose and check that its tests notice (tests/mutants/).

    Each curated mutant (``tests/mutants/catalog.py``) is applied, one at a time, to a
    scratch copy of the working tree (never to the tree itself), and the tests that guard
    it run there; the session fails when any mutant survives, and before running anything
    when a mutant's text no longer occurs exactly once. ``-- NAME ...`` runs some of them,
    ``-- --list`` lists them, ``-- --check`` only checks their texts.
    """
    session.install("-e", ".[test]")
    session.run("python", "-m", "tests.mutants", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """Check style and formatting with ruff."""
    session.install(RUFF)
    session.run("ruff", "check", *_lint_paths())
    session.run("ruff", "format", "--check", *_lint_paths())


@nox.session
def typecheck(session: nox.Session) -> None:
    """Type-check the packages named in pyproject's [tool.mypy] with mypy --strict."""
    # The embedded extra brings pgserver, whose types sqla_queue.testing.embedded uses.
    session.install("-e", ".[lint,embedded]")
    session.run("mypy", *session.posargs)


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation, failing on warnings (``-- --site-dir DIR`` to build elsewhere)."""
    session.install("-e", ".[docs]")
    session.run("mkdocs", "build", "--strict", *session.posargs)


@nox.session
def build(session: nox.Session) -> None:
    """Build the sdist, then the wheel from it, and ``twine check --strict`` both.

    They go to ``dist/`` (``-- DIR`` for another directory), replacing this version's old
    ones. Building the wheel from the sdist catches a file the sdist leaves out.
    """
    session.install(*_extra("release"))
    outdir = Path(session.posargs[0]) if session.posargs else ROOT / "dist"
    for old in outdir.glob("sqla_queue-*"):
        old.unlink()
    session.run("python", "-m", "build", "--outdir", str(outdir), str(ROOT))
    session.run("twine", "check", "--strict", *sorted(map(str, outdir.glob("sqla_queue-*"))))
