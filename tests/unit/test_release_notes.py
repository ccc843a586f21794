"""The changelog and the supported versions stay in step with the code and pyproject.toml.

A new schema version in ``alembic_ext`` needs its entry in ``CHANGELOG.md``; the lower
bounds that the README and the versioning page state are the ones the version matrix
installs (``noxfile.py`` reads them from ``pyproject.toml``).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from alembic_ext.versions import known_versions

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
CHANGELOG = ROOT / "CHANGELOG.md"


def _project() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as file:
        project: dict[str, object] = tomllib.load(file)["project"]
    return project


def _lower_bound(distribution: str) -> str:
    dependencies = _project()["dependencies"]
    assert isinstance(dependencies, list)
    for requirement in dependencies:
        match = re.fullmatch(rf"{distribution}>=([0-9.]+)", requirement, re.IGNORECASE)
        if match:
            return match.group(1)
    raise AssertionError(f"no {distribution}>=X in pyproject.toml")


def test_the_changelog_opens_with_unreleased_and_has_this_release() -> None:
    headings = re.findall(r"^## \[([^\]]+)\]", CHANGELOG.read_text(), re.MULTILINE)
    assert headings[0] == "Unreleased"
    assert _project()["version"] in headings


@pytest.mark.parametrize("version", known_versions())
def test_every_schema_version_is_in_the_changelog(version: int) -> None:
    """Each schema version has its ``**Version N**`` entry: what it is, or what its step does."""
    assert f"**Version {version}**" in CHANGELOG.read_text()


@pytest.mark.parametrize("page", ["README.md", "docs/versioning.md", "docs/index.md"])
@pytest.mark.parametrize("distribution", ["sqlalchemy", "alembic"])
def test_the_stated_lower_bounds_are_pyprojects(page: str, distribution: str) -> None:
    bound = _lower_bound(distribution)
    text = (ROOT / page).read_text()
    name = {"sqlalchemy": "SQLAlchemy", "alembic": "Alembic"}[distribution]
    stated = re.findall(rf"{name}\W+(\d+\.\d+\.\d+)\s+or\s+(?:later|newer)", text)
    assert stated, f"{page} states no lower bound for {name}"
    assert set(stated) == {bound}, f"{page} says {name} {stated}, pyproject.toml {bound}"
