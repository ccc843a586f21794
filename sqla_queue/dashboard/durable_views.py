"""The dashboard's action on durable jobs: send a signal from a job's page.

A POST like every action (see :mod:`.views`): it runs only for a request the host's
``auth`` accepts, from this site, with a valid CSRF token; it calls ``Queue.signal`` in a
transaction that commits, then redirects (303) to the job's page, which says what
happened. The job's page itself (its wait, its committed steps) is :class:`.views.Views`'s.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy.engine import Connection
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from sqla_queue.dashboard import params
from sqla_queue.dashboard.params import RequestRefused
from sqla_queue.dashboard.views import Views
from sqla_queue.errors import JobNotFoundError

__all__ = ["MAX_SIGNAL_NAME", "DurablePages", "signal_payload"]

#: The longest signal name ``Queue.signal`` takes.
MAX_SIGNAL_NAME = 200
# The form's whole body is capped (views._MAX_FORM_BYTES); the payload gets most of it.
_MAX_PAYLOAD = 12_000


def signal_payload(text: str) -> Any:
    """The signal form's payload field as a JSON value (blank: ``None``); else
    :class:`RequestRefused` (400) saying why."""
    if not text.strip():
        return None
    params.text("the payload", text, max_length=_MAX_PAYLOAD)
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise RequestRefused(400, f"The payload is not JSON: {exc}.") from None
    except RecursionError:
        raise RequestRefused(
            400, "The payload nests lists and objects too deeply to be read."
        ) from None
    # PostgreSQL's jsonb has no NUL character: refused here rather than by the database.
    if "\\u0000" in json.dumps(value):
        raise RequestRefused(400, "The payload holds a NUL character (\\u0000).")
    return value


class DurablePages:
    """The durable-job endpoints of one dashboard, on the :class:`~.views.Views` whose
    queue, database, guard and paths they share."""

    def __init__(self, views: Views) -> None:
        self.views = views

    async def signal(self, request: Request) -> Response:
        """Send the form's signal (``name``, JSON ``payload``) to the job of the path."""
        views = self.views
        form = await views._guard(request)
        job_id = params.job_id(request.path_params["job_id"])
        name = params.text(
            "the signal's name", form.get("name", "").strip(), max_length=MAX_SIGNAL_NAME
        )
        if not name:
            raise RequestRefused(400, "A signal needs a name.")
        payload = signal_payload(form.get("payload", ""))
        queue = views.queue

        def run(connection: Connection) -> Any:
            return queue.signal(connection, job_id, name, payload)

        try:
            sent = await views.db.write(run)
        except JobNotFoundError:
            raise RequestRefused(404, f"Nothing was sent: there is no job {job_id}.") from None
        except (TypeError, ValueError) as exc:
            raise RequestRefused(400, str(exc)) from None
        if not sent.stored:
            code = "signal-repeated"
        elif sent.status != "queued":
            code = "signal-finished"
        else:
            code = "signal-woke" if sent.woke else "signal-stored"
        path = views._path(request, "job", {"done": code}, job_id=job_id)
        return RedirectResponse(path, 303)
