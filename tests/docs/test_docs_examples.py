"""Execute the code examples of the README and the docs against a fresh, empty database.

Which blocks run is set by HTML-comment markers in the Markdown, described in
:mod:`tests.docs.markdown`. In short: ``<!-- docs-test: page -->`` runs every ``python``
block of a page (``docs/tutorial.md`` has it); ``<!-- docs-test: run -->`` before a fence
runs that block; ``<!-- docs-test: skip -->`` excludes one; ``<!-- docs-test: output -->``
before a ``text`` block lists lines the examples must print (each exactly as often as
listed, in any order); ``<!-- docs-test: file PATH -->`` writes a block to ``PATH``;
``<!-- docs-test: shell -->`` marks a ``bash`` block of commands the README test runs.

The runnable blocks of one page run in order, in one namespace, in a fresh Python
subprocess. Its working directory is a temporary directory, and ``DATABASE_URL`` points at
a fresh empty database (the ``empty_db_url`` fixture). Each block is compiled under the
Markdown file's path, padded to its line number, so a traceback names the Markdown line
that failed. A block that raises makes the subprocess exit non-zero, which fails the test.
Each page of ``docs/`` with a runnable block gets its own test, so a new example is tested
as soon as it is marked.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest
from sqlalchemy import create_engine, make_url, text

from sqla_queue.testing.databases import DatabaseFactory
from tests.docs.markdown import Block, Page, parse_page

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
TUTORIAL = DOCS / "tutorial.md"
TIMEOUT = 180

RUNNER = """\
import builtins
import json
import sys
import threading

# An example's worker thread and its main thread may print at once; print writes the text
# and the newline separately, so two lines could run together. One print at a time.
_print, _printing = builtins.print, threading.Lock()


def _one_print_at_a_time(*args, **kwargs):
    with _printing:
        _print(*args, **kwargs)


builtins.print = _one_print_at_a_time
namespace = {"__name__": "__main__"}
with open(sys.argv[1], encoding="utf-8") as handle:
    blocks = json.load(handle)
for block in blocks:
    source = "\\n" * (block["line"] - 1) + block["source"]
    exec(compile(source, block["path"], "exec"), namespace)
"""


def _pages_with_examples() -> list[Path]:
    pages = sorted(DOCS.rglob("*.md"))
    return [p for p in pages if p != TUTORIAL and parse_page(p).runnable]


def _environment(database_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env["DATABASE_URL"] = database_url
    # The examples' `sqla-queue` and `python` must be the ones of this interpreter.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _report(what: str, result: subprocess.CompletedProcess[str]) -> str:
    return (
        f"{what} exited with status {result.returncode}\n"
        f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
    )


def run_blocks(
    blocks: Sequence[Block], workdir: Path, database_url: str
) -> subprocess.CompletedProcess[str]:
    """Run ``blocks`` in order in one namespace in a subprocess; fail the test if one raises."""
    assert blocks, "no runnable blocks found"
    payload = [{"path": str(b.path), "line": b.line, "source": b.source} for b in blocks]
    (workdir / "blocks.json").write_text(json.dumps(payload), encoding="utf-8")
    (workdir / "run_examples.py").write_text(RUNNER, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "run_examples.py", "blocks.json"],
        cwd=workdir,
        env=_environment(database_url),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    where = ", ".join(b.location for b in blocks)
    assert result.returncode == 0, _report(f"examples ({where})", result)
    return result


def run_shell(command: str, workdir: Path, database_url: str) -> subprocess.CompletedProcess[str]:
    """Run one documented shell command with bash; fail the test if it fails."""
    result = subprocess.run(
        ["bash", "-c", command],
        cwd=workdir,
        env=_environment(database_url),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, _report(repr(command), result)
    return result


def expected_output(page: Page) -> Counter[str]:
    """Every line the page's output blocks show, with how often it is shown."""
    return Counter(
        line.strip() for block in page.outputs for line in block.source.splitlines() if line.strip()
    )


def assert_printed(page: Page, stdout: str) -> None:
    """Each line of the page's output blocks was printed exactly as often as shown."""
    printed = Counter(line.strip() for line in stdout.splitlines())
    wrong = {
        line: (count, printed[line])
        for line, count in expected_output(page).items()
        if printed[line] != count
    }
    assert not wrong, (
        f"{page.path.name}: lines shown in the docs vs printed by the examples "
        f"(shown, printed): {wrong}\n--- stdout ---\n{stdout}"
    )


def query(database_url: str, sql: str) -> list[tuple[object, ...]]:
    """Rows of ``sql`` on the database the examples used."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(text(sql))]
    finally:
        engine.dispose()


def test_tutorial_runs_and_leaves_the_rows_it_describes(empty_db_url: str, tmp_path: Path) -> None:
    """The whole tutorial runs, prints what it shows, and the database agrees."""
    page = parse_page(TUTORIAL)
    assert page.runs_whole_page
    assert len(page.runnable) >= 8, "the tutorial lost its examples"
    assert len(page.outputs) >= 5, "the tutorial lost its printed results"

    result = run_blocks(page.runnable, tmp_path, empty_db_url)

    assert_printed(page, result.stdout)
    # The rolled-back order left no row, and its job none either.
    assert query(empty_db_url, "SELECT id, email, receipt_sent FROM orders ORDER BY id") == [
        (1, "ada@example.com", True)
    ]
    assert query(empty_db_url, "SELECT id, task, status FROM sqla_queue_jobs ORDER BY id") == [
        (1, "send_receipt", "succeeded"),
        (3, "charge_card", "failed"),
    ]
    assert query(empty_db_url, "SELECT count(*) FROM sqla_queue_job_executions") == [(0,)]


@pytest.mark.parametrize(
    "page_path",
    _pages_with_examples(),
    ids=lambda p: str(p.relative_to(DOCS)),
)
def test_guide_examples_run(page_path: Path, empty_db_url: str, tmp_path: Path) -> None:
    """The marked examples of each docs page run in order and print what the page shows."""
    page = parse_page(page_path)
    for block in page.marked("file"):
        target = tmp_path / str(block.argument)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.source, encoding="utf-8")

    result = run_blocks(page.runnable, tmp_path, empty_db_url)

    assert_printed(page, result.stdout)


def _with_burst(command: str) -> str:
    # The README shows a long-running worker; the test needs it to return when idle.
    return "\n".join(
        f"{line} --burst" if line.strip().startswith("sqla-queue worker") else line
        for line in command.splitlines()
    )


def _quick_start_blocks() -> tuple[Page, Block, Block]:
    """The README's quick start: the page, its database set-up commands, its CLI worker."""
    page = parse_page(README)
    shells = page.marked("shell")
    assert [b.argument for b in page.marked("file")] == ["myapp/jobs.py"]
    assert len(page.runnable) >= 2, "the quick start lost its enqueue or worker example"
    assert len(shells) == 2, "the quick start needs its database set-up and its CLI worker"
    setup, worker = shells
    assert "createdb" in setup.source and "export DATABASE_URL=" in setup.source, setup.source
    assert "sqla-queue worker" in worker.source
    return page, setup, worker


def run_quick_start(database_url: str, workdir: Path) -> None:
    """Everything after the database set-up, copied from the README, on ``database_url``."""
    page, _setup, worker = _quick_start_blocks()
    for block in page.marked("file"):
        target = workdir / str(block.argument)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.source, encoding="utf-8")

    result = run_blocks(page.runnable, workdir, database_url)
    assert_printed(page, result.stdout)

    # A job for the CLI worker, enqueued the way the quick start does it.
    produce = Block(
        path=workdir / "produce.py",
        line=1,
        language="python",
        source=(
            "from myapp.jobs import SessionLocal, send_welcome\n"
            "with SessionLocal.begin() as session:\n"
            "    send_welcome.enqueue(session, 42)\n"
        ),
        marker=None,
        argument=None,
    )
    run_blocks([produce], workdir, database_url)
    cli = run_shell(_with_burst(worker.source), workdir, database_url)
    assert cli.stdout.count("welcome mail for user 42") == 1, _report("the CLI worker", cli)

    assert query(database_url, "SELECT email FROM users ORDER BY id") == [("ada@example.com",)]
    statuses = query(
        database_url, "SELECT payload -> 'args', status FROM sqla_queue_jobs ORDER BY id"
    )
    assert statuses == [([1], "succeeded"), ([42], "succeeded")]


_FALLBACK_URL = re.compile(r"""os\.environ\.get\(\s*"DATABASE_URL",\s*"(?P<url>[^"]+)"\s*\)""")
_LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def test_readme_quick_start_from_its_own_database_set_up(
    admin_url: str,
    db_factory: DatabaseFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    """Copy-pasted whole: the set-up commands create the database the code falls back to.

    The README's ``createdb`` and ``export`` run as shown, with only the database's name
    made unique (``myapp`` may exist on a shared server); the URL they export must be the
    one ``myapp/jobs.py`` falls back to, and the rest of the quick start (the app module,
    enqueue, a worker in code, then the CLI) runs on it. Where those commands cannot run
    (a test server that is not local, no ``createdb``), the rest runs on a fresh empty
    database instead, so the quick start itself is always tested, once.
    """
    server = make_url(admin_url)
    cannot = None
    if server.host not in _LOCAL_HOSTS:
        cannot = f"the README's commands use localhost; the test server is {server.host}"
    elif shutil.which("createdb") is None:
        cannot = "createdb (PostgreSQL's client programs) is not installed"
    if cannot is not None:
        run_quick_start(request.getfixturevalue("empty_db_url"), tmp_path)
        pytest.skip(f"the quick start ran on a fresh database, not its own set-up: {cannot}")
    _page, setup, _worker = _quick_start_blocks()
    jobs = parse_page(README).marked("file")[0].source
    fallback = _FALLBACK_URL.search(jobs)
    assert fallback, "myapp/jobs.py lost its DATABASE_URL fallback"

    name = f"sqlaq_readme_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    # The same connection settings for createdb, psql and the URL: libpq's environment.
    for variable, value in (
        ("PGUSER", server.username),
        ("PGPORT", server.port),
        ("PGPASSWORD", server.password),
    ):
        if value is not None:
            monkeypatch.setenv(variable, str(value))
    commands = re.sub(r"\bmyapp\b", name, setup.source)
    try:
        exported = run_shell(commands + '\nprintf "%s" "$DATABASE_URL"\n', tmp_path, "")
        assert exported.stdout == fallback.group("url").replace("/myapp", f"/{name}")
        run_quick_start(exported.stdout, tmp_path)
    finally:
        db_factory.drop(name)
