"""The README's two set-up commands, and CI running the README's test command.

No database: these read files. The commands themselves run in CI (`.ci/run`) and in the
acceptance tests of the demo; this only keeps the README, the packaging and CI in step.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from tests.docs.markdown import parse_page

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

DEMO_COMMAND = (
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[embedded]' "
    "&& sqla-queue demo"
)
TEST_COMMAND = (
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[test]' "
    "&& python -m pytest -q"
)


def _bash_blocks() -> list[str]:
    return [b.source.strip() for b in parse_page(README).blocks if b.language == "bash"]


def test_readme_has_exactly_the_two_setup_commands_each_in_its_own_block() -> None:
    """Each set-up command is a code block of its own, so it can be copied whole."""
    blocks = _bash_blocks()
    assert blocks.count(DEMO_COMMAND) == 1
    assert blocks.count(TEST_COMMAND) == 1
    setup = [b for b in blocks if b.startswith("python3 -m venv")]
    assert setup == [DEMO_COMMAND, TEST_COMMAND]


def test_readme_names_the_database_fallbacks() -> None:
    """Without a URL, the demo uses pgserver and the tests the local or embedded server."""
    text = README.read_text(encoding="utf-8")
    for needle in ("DATABASE_URL", "SQLA_QUEUE_TEST_URL", "pgserver", "127.0.0.1:5432"):
        assert needle in text, needle


def test_ci_runs_the_readme_test_command() -> None:
    """`.ci/run` runs the test command that the README gives, verbatim."""
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    command = TEST_COMMAND.rsplit("&& ", 1)[1]
    runs = [line.strip() for line in ci.splitlines() if not line.strip().startswith("#")]
    assert any(re.match(rf"{re.escape(command)}(\s|$)", line) for line in runs), command


def test_setup_commands_name_extras_that_exist() -> None:
    """The extras the commands install are declared, and bring what the commands need."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    assert any(dep.startswith("pgserver") for dep in extras["embedded"])
    assert any(dep.startswith("pytest") for dep in extras["test"])
    assert project["scripts"]["sqla-queue"] == "sqla_queue.__main__:main"
