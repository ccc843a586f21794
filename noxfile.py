"""Developer tasks: ``nox -s tests``, ``nox -s lint``, ``nox -s typecheck``, ``nox -s docs``.

Arguments after ``--`` go to pytest, e.g. ``nox -s tests -- -m unit -x``.

These sessions are the one definition of the checks: which paths are linted, and with
which tools. The tool pins are those of pyproject.toml's extras (ruff's is read from the
``lint`` extra below). CI (``.ci/run``) runs the lint, typecheck and docs sessions inside
its own fresh virtualenv (``--no-venv --no-install``, the ``dev`` extra installed), so it
names neither paths nor pins.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"

ROOT = Path(__file__).parent
LINT_PATHS = ("sqla_queue", "alembic_ext", "tests", "examples", "bench", "noxfile.py")


def _extra(name: str) -> list[str]:
    """The requirements of one of pyproject.toml's extras."""
    with (ROOT / "pyproject.toml").open("rb") as file:
        extras: dict[str, list[str]] = tomllib.load(file)["project"]["optional-dependencies"]
    return extras[name]


# ruff's pin lives in the `lint` extra, which the `dev` extra (and so CI) installs too.
RUFF = next(req for req in _extra("lint") if req.startswith("ruff"))


def _lint_paths() -> list[str]:
    # Git does not keep empty directories, so some of these may be missing in a fresh clone,
    # and ruff fails on paths that do not exist.
    return [path for path in LINT_PATHS if (ROOT / path).exists()]


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite; needs PostgreSQL or falls back to the embedded server."""
    session.install("-e", ".[test]")
    session.run("pytest", *session.posargs)


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
