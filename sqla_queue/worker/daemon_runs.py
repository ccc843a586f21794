"""One run of a daemon instance, on a thread of its own.

The daemon supervisor (:mod:`sqla_queue.worker.daemons`) decides which instances this
worker holds and when each starts; this module runs one: it builds the instance's
:class:`~sqla_queue.daemons.DaemonContext`, calls the daemon's function on a thread of its
own (a ``def`` daemon directly, an ``async def`` one on an event loop of its own, with an
engine of its own), closes the session the context opened, and tells the supervisor how
the run ended.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, async_sessionmaker
from sqlalchemy.orm import sessionmaker

from sqla_queue.daemons import DaemonContext, DaemonSpec
from sqla_queue.worker.pools import own_pool_engine
from sqla_queue.worker.services import ServiceEnv

__all__ = ["DAEMON_POOL_SIZE", "RunEnded", "daemon_context", "daemon_thread", "loop_engine"]

log = logging.getLogger("sqla_queue.worker")

#: Connections the engine of an ``async def`` daemon's loop keeps open between sessions.
DAEMON_POOL_SIZE = 1

#: Called on the run's thread as it ends: with what the daemon raised, or None.
RunEnded = Callable[[BaseException | None], None]


def daemon_context(spec: DaemonSpec, number: int, env: ServiceEnv) -> DaemonContext:
    """The context of one run of instance ``number`` of ``spec`` on the worker of ``env``."""
    return DaemonContext(
        name=spec.name,
        instance=number,
        worker_id=env.worker_id,
        session_factory=_session_factory_for(spec, env),
        is_async=spec.is_async,
    )


def daemon_thread(spec: DaemonSpec, context: DaemonContext, on_end: RunEnded) -> threading.Thread:
    """The thread of one run, not started yet: it calls ``spec``'s function with
    ``context``, closes the context's session, then calls ``on_end``."""
    target = _run_async if spec.is_async else _run_sync
    return threading.Thread(
        target=target,
        args=(spec, context, on_end),
        name=f"sqla-queue-daemon-{spec.name}-{context.instance}",
        daemon=True,  # a daemon that ignores the stop request must not hold the process
    )


def _session_factory_for(spec: DaemonSpec, env: ServiceEnv) -> Any:
    """The factory a daemon's context offers: one the daemon can use on its thread.

    A ``def`` daemon of an async worker gets a ``sessionmaker`` on the service's sync
    engine; an ``async def`` daemon of an async worker gets its factory rebound, on its
    own loop (see :func:`_main_async`); otherwise it is the worker's own factory.
    """
    factory = env.session_factory
    if not spec.is_async and _is_async_factory(factory):
        return sessionmaker(bind=env.engine)
    return factory


def _run_sync(spec: DaemonSpec, ctx: DaemonContext, on_end: RunEnded) -> None:
    error: BaseException | None = None
    try:
        spec.function(ctx)
    except BaseException as exc:  # SystemExit too: a crash of this instance only
        error = exc
    finally:
        _close_sync(ctx)
        on_end(error)


def _run_async(spec: DaemonSpec, ctx: DaemonContext, on_end: RunEnded) -> None:
    error: BaseException | None = None
    try:
        asyncio.run(_main_async(spec, ctx))
    except BaseException as exc:
        error = exc
    finally:
        on_end(error)


async def _main_async(spec: DaemonSpec, ctx: DaemonContext) -> None:
    engine = None
    factory = ctx.session_factory
    if _is_async_factory(factory) and factory.kw.get("bind") is not None:
        # The worker's async engine belongs to the worker's loop; this loop gets its own.
        engine = loop_engine(factory.kw["bind"])
        options = {k: v for k, v in factory.kw.items() if k != "bind"}
        ctx.session_factory = async_sessionmaker(bind=engine, class_=factory.class_, **options)
    try:
        await spec.function(ctx)
    finally:
        session = ctx._take_session()
        if session is not None:
            try:
                result = session.close()
                if asyncio.iscoroutine(result):
                    await result
            except Exception:
                log.exception("closing daemon %s's session failed", (ctx.name, ctx.instance))
        if engine is not None:
            await engine.dispose()


def loop_engine(bind: Any) -> AsyncEngine:
    """An async engine for the daemon's own event loop, derived from the worker's ``bind``.

    It is ``bind``'s engine in all but its pool (see :func:`own_pool_engine`): the same URL,
    ``connect_args`` or ``async_creator``, engine and pool events (a ``connect`` listener
    that sets ``search_path``) and execution options (a tenant's ``schema_translate_map``,
    a bound connection's too), with one connection kept, opened on this loop. Rebuilding
    it from the URL would lose all of those. Dispose of it on the same loop.
    """
    options: dict[str, Any] = {}
    if isinstance(bind, AsyncConnection):  # a connection cannot cross loops: its engine can
        if bind.sync_connection is not None:
            options = dict(bind.sync_connection.get_execution_options())
        bind = bind.engine
    if not isinstance(bind, AsyncEngine):
        raise TypeError(
            f"an async def daemon needs an async_sessionmaker bound to an AsyncEngine or "
            f"AsyncConnection, got bind={bind!r}"
        )
    own = own_pool_engine(bind.sync_engine, DAEMON_POOL_SIZE)
    if options:  # in place: disposing of a wrapper would tell the app's engine listeners
        own.update_execution_options(**options)
    return AsyncEngine(own)


def _is_async_factory(factory: Any) -> bool:
    return isinstance(factory, async_sessionmaker)


def _close_sync(ctx: DaemonContext) -> None:
    session = ctx._take_session()
    if session is not None:
        try:
            session.close()
        except Exception:
            log.exception("closing daemon %s[%s]'s session failed", ctx.name, ctx.instance)
