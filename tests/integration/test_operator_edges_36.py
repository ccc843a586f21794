"""The operators' command line at 80 columns (issue 36, §7), on a real database.

Each command is run as a terminal 80 columns wide would see it (``COLUMNS=80``), on a
shop whose names are as long as a newcomer's: ``collect_payment`` waits for the signal
``payment_received`` after two steps, ``print_shipping_label`` failed with a message.
Every line must fit, and what the operator came for must show whole: the wait, the
step's name, the error's message, the suspended count, the compensations a cancel
brings.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue.cli.failed import error_summary, short_type
from sqla_queue.cli.main import main
from sqla_queue.testing.databases import DatabaseFactory
from tests.support.operator36_app import (
    collect_payment,
    plain_task,
    print_shipping_label,
    queue,
)

pytestmark = pytest.mark.integration

TARGET = "tests.support.operator36_app:queue"
QUIET = {"install_signal_handlers": False, "poll_interval": 0.05}


@pytest.fixture
def shop(db_factory: DatabaseFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict]:
    """Three suspended payments, a failed label, a plain job; the URL and the ids."""
    monkeypatch.setenv("COLUMNS", "80")
    url = db_factory.clone("template0")
    engine: Engine = create_engine(url)
    with engine.begin() as connection:
        queue.create_all(connection)
    with Session(engine) as session, session.begin():
        payments = [collect_payment.enqueue(session, order) for order in (1, 2, 3)]
        label = print_shipping_label.enqueue(session)
        plain = plain_task.enqueue(session)
    queue.worker(sessionmaker(engine), **QUIET).run(burst=True)
    yield {
        "url": engine.url.render_as_string(hide_password=False),
        "payments": payments,
        "label": label,
        "plain": plain,
    }
    engine.dispose()
    db_factory.drop(url)


def cli(capsys: pytest.CaptureFixture[str], *argv: object, status: int = 0) -> list[str]:
    """Run ``sqla-queue``; its stdout's lines, each checked to fit 80 columns."""
    command, *rest = (str(arg) for arg in argv)
    url = rest.pop() if rest and rest[-1].startswith("postgresql") else None
    args = [command, TARGET, *(["--url", url] if url else []), *rest]
    assert main(args) == status, capsys.readouterr().err
    lines = capsys.readouterr().out.splitlines()
    for line in lines:
        assert len(line) <= 80, line
    return lines


def test_jobs_status_suspended_shows_the_whole_wait_and_no_column_of_dashes(
    shop: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = cli(capsys, "jobs", "--status", "suspended", shop["url"])
    header = lines[0].split()
    assert "finished" not in header and "about" not in lines[0]
    assert header[3:5] == ["waits", "for"]
    for payment in shop["payments"]:
        row = next(line for line in lines if line.split()[0] == str(payment))
        assert "signal:payment_received" in row
        assert "no deadline" in row


def test_a_mixed_listing_keeps_the_finish_times_and_cuts_the_wait_if_it_must(
    shop: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = cli(capsys, "jobs", shop["url"])
    assert "finished" in lines[0].split() and "waits" in lines[0].split()
    label = next(line for line in lines if line.split()[0] == str(shop["label"]))
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ", label)
    payment = next(line for line in lines if line.split()[0] == str(shop["payments"][0]))
    assert "signal:payment" in payment


def test_job_shows_its_steps_whole_before_their_version(
    shop: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = cli(capsys, "job", shop["payments"][0], shop["url"])
    text = "\n".join(lines)
    assert "waits for signal:payment_received" in text
    for step in ("reserve_stock_for_order", "charge_customer_card", "signal:payment_received"):
        assert re.search(rf"^{re.escape(step)}\s", text, re.M), text
    assert "version" not in next(line for line in lines if line.startswith("step"))
    assert "…" not in text


def test_a_plain_job_says_nothing_of_steps(shop: dict, capsys: pytest.CaptureFixture[str]) -> None:
    lines = cli(capsys, "job", shop["plain"], shop["url"])
    assert "steps" not in "\n".join(lines)
    assert lines[0].startswith(f"job {shop['plain']}  plain_task  succeeded")


def test_failed_shows_the_message_and_a_short_type(
    shop: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = cli(capsys, "failed", shop["url"])
    text = " ".join(" ".join(lines).split())
    assert "builtins." not in text
    message = "RuntimeError: out of paper in tray 2 of the label printer at the north dock"
    assert message in text
    assert str(shop["label"]) == lines[1].split()[0]
    # The whole error stays in --json.
    main(["failed", TARGET, "--url", shop["url"], "--json"])
    (listed,) = json.loads(capsys.readouterr().out)
    assert listed["last_error"]["type"] == "builtins.RuntimeError"


def test_short_type_keeps_the_class_and_its_module_s_last_part() -> None:
    assert short_type("builtins.RuntimeError") == "RuntimeError"
    assert short_type("sqlalchemy.exc.IntegrityError") == "exc.IntegrityError"
    assert short_type("shop.PrinterJammed") == "shop.PrinterJammed"
    assert short_type("Bare") == "Bare"
    assert error_summary({"type": "builtins.KeyError", "message": "'k'"}) == "KeyError: 'k'"
    assert error_summary(None) == "-"


def test_status_shows_the_suspended_column_its_summary_counts(
    shop: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = cli(capsys, "status", shop["url"])
    assert "suspended 3" in lines[0] + lines[1]
    header = next(line for line in lines if line.startswith("task "))
    columns = header.split()
    assert "suspended" in columns
    row = next(line for line in lines if line.startswith("collect_payment "))
    assert row.split()[columns.index("suspended")] == "3"
    # The columns of zeros went first; the note that names them is whole.
    assert any("--json shows all)" in line for line in lines)


def test_cancelling_a_suspended_job_says_its_compensations_follow(
    shop: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second, _ = shop["payments"]
    lines = cli(capsys, "cancel", first, shop["plain"], shop["url"], status=7)
    assert lines[0] == (
        f"job {first}: cancelled; 1 compensation follows (the next worker sweep enqueues it)"
    )
    assert lines[1].startswith(f"job {shop['plain']}: finished")
    assert main(["cancel", TARGET, "--url", shop["url"], "--json", str(second)]) == 0
    (outcome,) = json.loads(capsys.readouterr().out)
    assert outcome == {"id": second, "outcome": "cancelled", "compensations": 1}


@pytest.mark.parametrize("flags", [[], ["--async"]])
def test_a_worker_without_tasks_names_the_module_it_imported(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
) -> None:
    # The queue in one module, its tasks in another that the command never imports.
    name = f"shop_models_36_{len(flags)}"
    (tmp_path / f"{name}.py").write_text(
        "from sqlalchemy import MetaData\nfrom sqla_queue import Queue\n"
        "queue = Queue(metadata=MetaData(), prefix='e36_')\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        url = "postgresql+psycopg://nobody@127.0.0.1:1/never"  # refused before connecting
        status = main(["worker", f"{name}:queue", "--url", url, "--burst", *flags])
    finally:
        sys.modules.pop(name, None)
    err = capsys.readouterr().err
    assert status == 2, err
    assert f"this worker has no tasks: importing '{name}' (" in err
    assert str(tmp_path / f"{name}.py") in err
    assert "point the worker at that module" in err
