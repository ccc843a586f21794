"""Throwaway PostgreSQL clusters for tests: a primary, a streaming replica, a server in a
network namespace.

:meth:`TemporaryCluster.create` runs ``initdb`` (trust authentication, superuser
``postgres``) into a directory of the caller's and writes the settings and ``pg_hba.conf``
lines asked for; :meth:`TemporaryCluster.start` starts it with ``pg_ctl``, optionally
behind a command prefix (``["ip", "netns", "exec", "ns"]`` runs the server inside a network
namespace). :meth:`TemporaryCluster.basebackup_replica` copies a running cluster with
``pg_basebackup -R -X stream`` and starts the copy as a hot standby streaming from it;
:meth:`TemporaryCluster.wait_for_replay` waits until a replica has replayed everything its
primary had written. Used as a context manager, a cluster is stopped and its directory
deleted at the end of the block.

``initdb`` and the server refuse to run as root: started by root, every PostgreSQL command
runs as the ``postgres`` OS user (``runuser``), and the cluster's directory is handed to
that user. Each cluster's unix socket lives in its own directory, never the main server's
``/var/run/postgresql``, so a cluster on port 5432 of another namespace does not clash with
it; :meth:`TemporaryCluster.execute_sql` talks through that socket, which works from any
network namespace (a path socket is not namespaced).

The binaries are those of ``$SQLA_QUEUE_TEST_PG_BINDIR`` if set, else of the directory the
``initdb`` on ``PATH`` resolves to, else the newest ``/usr/lib/postgresql/*/bin``:
:func:`cluster_skip_reason` says why none can be used. Every command and every wait is
bounded in time; clusters still running when the interpreter exits are stopped then.
"""

from __future__ import annotations

import atexit
import contextlib
import grp
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from sqlalchemy.engine import URL

__all__ = [
    "BINDIR_ENV",
    "REPLICATION_SETTINGS",
    "RUN_AS",
    "ClusterError",
    "TemporaryCluster",
    "cluster_skip_reason",
    "find_bindir",
    "free_port",
    "new_cluster_root",
    "replication_hba_lines",
]

#: Set to a directory holding ``initdb``, ``pg_ctl``, ``postgres`` and ``pg_basebackup``.
BINDIR_ENV = "SQLA_QUEUE_TEST_PG_BINDIR"
#: The OS user the clusters run as when the tests run as root.
RUN_AS = "postgres"
#: Seconds one ``initdb`` or ``pg_basebackup`` may take.
COMMAND_TIMEOUT = 60.0
#: Seconds a cluster may take to accept connections, and to stop.
START_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0
#: Seconds one statement of :meth:`TemporaryCluster.execute_sql` may take to connect.
CONNECT_TIMEOUT = 5
#: Longest unix socket path (``sun_path`` holds 108 bytes with its terminating NUL).
_MAX_SOCKET_PATH = 100
#: What each cluster's ``postgresql.conf`` gets unless the caller says otherwise: small and
#: fast (a test cluster is thrown away, so ``fsync`` is off). ``synchronous_commit`` stays
#: on: an asynchronous commit reaches a replica only when the WAL writer next flushes.
BASE_SETTINGS: Mapping[str, str] = {
    "fsync": "off",
    "shared_buffers": "16MB",
    "max_connections": "60",
    "max_wal_size": "256MB",
    "log_min_messages": "warning",
    "log_line_prefix": "'%m [%p] '",
}
#: Settings a primary needs for a streaming replica (``hot_standby`` only matters on the
#: replica, which copies the primary's ``postgresql.conf``).
REPLICATION_SETTINGS: Mapping[str, str] = {
    "wal_level": "replica",
    "max_wal_senders": "5",
    "max_replication_slots": "5",
    "wal_keep_size": "128MB",
    "hot_standby": "on",
    "hot_standby_feedback": "on",
}

_RUNNING: set[TemporaryCluster] = set()
_RUNNING_LOCK = threading.Lock()


class ClusterError(RuntimeError):
    """A PostgreSQL command failed or a cluster did not come up in time (with its log)."""


def find_bindir() -> Path | None:
    """The directory of the PostgreSQL server binaries used here, or None if there is none."""
    wanted = ("initdb", "pg_ctl", "postgres")
    candidates: list[Path] = []
    if os.environ.get(BINDIR_ENV):
        candidates.append(Path(os.environ[BINDIR_ENV]))
    found = shutil.which("initdb")
    if found:
        candidates.append(Path(found).resolve().parent)
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    candidates.extend(versions)
    for directory in candidates:
        if all(os.access(directory / name, os.X_OK) for name in wanted):
            return directory
    return None


def _run_as() -> str | None:
    """The OS user to run PostgreSQL as: :data:`RUN_AS` when we are root, else None (us)."""
    return RUN_AS if os.geteuid() == 0 else None


def cluster_skip_reason(*, replication: bool = False) -> str | None:
    """Why throwaway clusters cannot be made here, or None when they can.

    Needs Linux or another POSIX system, PostgreSQL's ``initdb``, ``pg_ctl`` and
    ``postgres`` (and ``pg_basebackup`` when ``replication``), and, when running as root,
    a ``postgres`` OS user and ``runuser`` to run them as.
    """
    if sys.platform == "win32":
        return "throwaway PostgreSQL clusters need a POSIX system"
    bindir = find_bindir()
    if bindir is None:
        return (
            "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found: install the "
            f"server package or set ${BINDIR_ENV}"
        )
    if replication and not os.access(bindir / "pg_basebackup", os.X_OK):
        return f"pg_basebackup not found in {bindir}"
    user = _run_as()
    if user is not None:
        try:
            pwd.getpwnam(user)
        except KeyError:
            return f"running as root, and there is no {user!r} OS user to run PostgreSQL as"
        if shutil.which("runuser") is None:
            return "running as root, and runuser (util-linux) is not installed"
    return None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on at ``host`` right now (another process may take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def new_cluster_root(prefix: str = "sqlaq-pg-") -> Path:
    """A new empty directory under the system's temporary directory for clusters to go in.

    Unlike ``tempfile.mkdtemp()`` or pytest's ``tmp_path`` (mode 0700, root's when the tests
    run as root), the user PostgreSQL runs as may traverse it. The caller deletes it
    (``shutil.rmtree``); each cluster made in it deletes its own subdirectory.
    """
    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o755)
    return root


def replication_hba_lines(network: str = "0.0.0.0/0") -> list[str]:
    """``pg_hba.conf`` lines letting anyone from ``network`` in, replication included.

    ``initdb --auth=trust`` already trusts loopback and the unix socket; these are for a
    server listening on another address (a network namespace's).
    """
    return [f"host all all {network} trust", f"host replication all {network} trust"]


def _command(bindir: Path, name: str, *args: str, wrapper: Sequence[str] = ()) -> list[str]:
    """``wrapper + [runuser -u postgres --] + [bindir/name, *args]``."""
    user = _run_as()
    as_user = ["runuser", "-u", user, "--"] if user else []
    return [*wrapper, *as_user, str(bindir / name), *args]


def _run(command: Sequence[str], *, timeout: float, cwd: Path) -> str:
    """Run ``command`` (bounded); return its output, raise :class:`ClusterError` on failure."""
    try:
        done = subprocess.run(
            list(command),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
        )
    except subprocess.TimeoutExpired as exc:
        raise ClusterError(f"{' '.join(command)}: no answer within {timeout:.0f}s") from exc
    if done.returncode != 0:
        raise ClusterError(
            f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}{done.stderr}"
        )
    return done.stdout


def _hand_over(path: Path) -> None:
    """Give ``path`` and everything under it to the user PostgreSQL runs as."""
    user = _run_as()
    if user is None:
        return
    entry = pwd.getpwnam(user)
    for directory, dirs, files in os.walk(path):
        os.chown(directory, entry.pw_uid, entry.pw_gid)
        for name in [*dirs, *files]:
            os.chown(
                os.path.join(directory, name), entry.pw_uid, entry.pw_gid, follow_symlinks=False
            )


def _check_reachable(path: Path) -> None:
    """Raise unless the user PostgreSQL runs as may traverse every ancestor of ``path``."""
    user = _run_as()
    if user is None:
        return
    entry = pwd.getpwnam(user)
    groups = {entry.pw_gid} | {g.gr_gid for g in grp.getgrall() if user in g.gr_mem}
    for ancestor in path.resolve().parents:
        info = ancestor.stat()
        if info.st_uid == entry.pw_uid:
            allowed = bool(info.st_mode & 0o100)
        elif info.st_gid in groups:
            allowed = bool(info.st_mode & 0o010)
        else:
            allowed = bool(info.st_mode & 0o001)
        if not allowed:
            raise ClusterError(
                f"the {user!r} OS user cannot reach {path}: {ancestor} is closed to it "
                "(make the cluster in a directory it can traverse, such as one of "
                "new_cluster_root(), not under pytest's tmp_path or a mkdtemp(), both 0700)"
            )


def _conf_value(value: str) -> str:
    """``value`` as written in postgresql.conf: numbers and words bare, the rest quoted."""
    if value.startswith("'") or re.fullmatch(r"[A-Za-z0-9_.]+", value):
        return value
    return "'" + value.replace("'", "''") + "'"


class TemporaryCluster:
    """One throwaway PostgreSQL cluster: its data directory, port, socket and server.

    Make one with :meth:`create` (or :meth:`basebackup_replica` of a running one). Its
    directory ``root`` holds ``data/`` (the cluster), ``server.log`` and, unless the path
    would be too long for a unix socket, the socket itself.
    """

    def __init__(
        self,
        root: Path,
        *,
        port: int,
        listen_addresses: str,
        socket_dir: Path,
        bindir: Path,
        primary: TemporaryCluster | None = None,
        owns_socket_dir: bool = False,
    ) -> None:
        self.root = root
        self.port = port
        self.listen_addresses = listen_addresses
        self.socket_dir = socket_dir
        self.bindir = bindir
        #: The cluster this one streams from, for a replica.
        self.primary = primary
        self._owns_socket_dir = owns_socket_dir
        self._wrapper: tuple[str, ...] = ()
        self._running = False

    # -- making --------------------------------------------------------------------------

    @property
    def data_dir(self) -> Path:
        """The cluster's data directory (``PGDATA``)."""
        return self.root / "data"

    @property
    def log_path(self) -> Path:
        """The server's log file."""
        return self.root / "server.log"

    @staticmethod
    def _prepare_root(root: Path) -> tuple[Path, Path, bool]:
        """Make ``root`` (empty) and pick the socket directory; return the bindir too."""
        reason = cluster_skip_reason()
        if reason is not None:
            raise ClusterError(reason)
        bindir = find_bindir()
        assert bindir is not None
        root.mkdir(parents=True, exist_ok=True)
        if any(root.iterdir()):
            raise ClusterError(f"{root} is not empty: a cluster needs a directory of its own")
        _check_reachable(root)
        socket_dir, owns = root, False
        if len(str(root)) + len("/.s.PGSQL.65535.lock") > _MAX_SOCKET_PATH:
            socket_dir, owns = Path(tempfile.mkdtemp(prefix="sqlaq-pgsock-")), True
            socket_dir.chmod(0o755)
            _hand_over(socket_dir)
        root.chmod(0o755)
        return bindir, socket_dir, owns

    @classmethod
    def create(
        cls,
        root: Path,
        *,
        port: int,
        listen_addresses: str = "127.0.0.1",
        settings: Mapping[str, str] | None = None,
        hba_lines: Sequence[str] = (),
    ) -> TemporaryCluster:
        """Run ``initdb`` into ``root/data`` (not started: call :meth:`start`).

        ``root`` is made if missing and must be empty; :meth:`remove` deletes it.
        Authentication is ``trust`` for the unix socket and loopback (replication too);
        ``hba_lines`` are appended to ``pg_hba.conf`` (see :func:`replication_hba_lines`),
        ``settings`` to ``postgresql.conf`` after :data:`BASE_SETTINGS`, the port, the
        listen addresses (``""``: the unix socket only) and the socket directory.
        """
        bindir, socket_dir, owns = cls._prepare_root(root)
        cluster = cls(
            root,
            port=port,
            listen_addresses=listen_addresses,
            socket_dir=socket_dir,
            bindir=bindir,
            owns_socket_dir=owns,
        )
        _hand_over(root)
        _run(
            _command(
                bindir,
                "initdb",
                "-D",
                str(cluster.data_dir),
                "--username=postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ),
            timeout=COMMAND_TIMEOUT,
            cwd=root,
        )
        cluster._write_settings({**BASE_SETTINGS, **(settings or {})})
        if hba_lines:
            with (cluster.data_dir / "pg_hba.conf").open("a") as hba:
                hba.write("\n# added by tests/support/clusters.py\n")
                hba.write("".join(f"{line}\n" for line in hba_lines))
        return cluster

    def _write_settings(self, settings: Mapping[str, str]) -> None:
        """Append ``settings`` and this cluster's address to ``postgresql.conf``.

        Later lines win in postgresql.conf, so a replica's copy of its primary's file
        gets its own port and socket this way.
        """
        own = {
            "port": str(self.port),
            "listen_addresses": f"'{self.listen_addresses}'",
            "unix_socket_directories": f"'{self.socket_dir}'",
        }
        lines = [f"{key} = {_conf_value(value)}" for key, value in {**settings, **own}.items()]
        with (self.data_dir / "postgresql.conf").open("a") as conf:
            conf.write(f"\n# added by tests/support/clusters.py for port {self.port}\n")
            conf.write("".join(f"{line}\n" for line in lines))

    # -- running -------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """True between a successful :meth:`start` and :meth:`stop`."""
        return self._running

    def start(self, wrapper: Sequence[str] = (), *, timeout: float = START_TIMEOUT) -> None:
        """Start the server (``pg_ctl start -w``) and wait until it accepts connections.

        ``wrapper`` prefixes the command, e.g. ``["ip", "netns", "exec", "ns"]`` to run the
        server inside a network namespace. Raises :class:`ClusterError`, with the server's
        log, when it is not up within ``timeout`` seconds.
        """
        if self._running:
            return
        self._wrapper = tuple(wrapper)
        command = _command(
            self.bindir,
            "pg_ctl",
            "start",
            "-w",
            "-t",
            str(int(timeout)),
            "-D",
            str(self.data_dir),
            "-l",
            str(self.log_path),
            wrapper=wrapper,
        )
        try:
            _run(command, timeout=timeout + 5, cwd=self.root)
        except ClusterError as exc:
            self._kill_postmaster()
            raise ClusterError(f"{exc}\n--- server log ---\n{self.log()}") from exc
        with _RUNNING_LOCK:
            _RUNNING.add(self)
        self._running = True

    def stop(self, *, timeout: float = STOP_TIMEOUT) -> None:
        """Stop the server (fast shutdown, else immediate, else SIGKILL); idempotent."""
        if not self._running and not (self.data_dir / "postmaster.pid").exists():
            return
        for mode in ("fast", "immediate"):
            try:
                _run(
                    _command(
                        self.bindir,
                        "pg_ctl",
                        "stop",
                        "-w",
                        "-t",
                        str(int(timeout)),
                        "-m",
                        mode,
                        "-D",
                        str(self.data_dir),
                    ),
                    timeout=timeout + 5,
                    cwd=self.root,
                )
                break
            except ClusterError:
                continue
        else:
            self._kill_postmaster()
        self._running = False
        with _RUNNING_LOCK:
            _RUNNING.discard(self)

    def _postmaster_pid(self) -> int | None:
        try:
            first = (self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0]
        except OSError:
            return None
        return int(first) if first.strip().isdigit() else None

    def _kill_postmaster(self) -> None:
        """SIGKILL the postmaster (its children exit with it), waiting boundedly."""
        pid = self._postmaster_pid()
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + STOP_TIMEOUT
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        with contextlib.suppress(OSError):
            (self.data_dir / "postmaster.pid").unlink()

    def remove(self) -> None:
        """Stop the server and delete the cluster's directory (and socket directory)."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
        if self._owns_socket_dir:
            shutil.rmtree(self.socket_dir, ignore_errors=True)

    def __enter__(self) -> TemporaryCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.remove()

    def log(self) -> str:
        """What the server wrote to its log so far (for a failing test's message)."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    # -- talking to it -------------------------------------------------------------------

    def url(
        self,
        database: str = "postgres",
        *,
        host: str | None = None,
        driver: str = "postgresql+psycopg",
    ) -> str:
        """A SQLAlchemy URL of ``database`` as ``postgres`` on this cluster.

        ``host`` defaults to the first listen address (``127.0.0.1`` for ``*``); with no
        listen address at all (``""``) the URL goes through the unix socket.
        """
        if host is None:
            first = self.listen_addresses.split(",")[0].strip()
            host = "127.0.0.1" if first in ("*", "0.0.0.0") else first
        if not host:
            url = URL.create(
                driver,
                username="postgres",
                database=database,
                query={"host": str(self.socket_dir), "port": str(self.port)},
            )
        else:
            url = URL.create(
                driver, username="postgres", host=host, port=self.port, database=database
            )
        return url.render_as_string(hide_password=False)

    def execute_sql(self, sql: str, database: str = "postgres") -> list[tuple[Any, ...]]:
        """Run ``sql`` (autocommit) through the unix socket; return its rows, if any."""
        import psycopg

        with psycopg.connect(
            host=str(self.socket_dir),
            port=self.port,
            user="postgres",
            dbname=database,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT,
        ) as connection:
            cursor = connection.execute(sql.encode())
            return list(cursor.fetchall()) if cursor.description is not None else []

    # -- replication ---------------------------------------------------------------------

    def basebackup_replica(
        self,
        root: Path,
        *,
        port: int,
        listen_addresses: str | None = None,
        settings: Mapping[str, str] | None = None,
        wrapper: Sequence[str] = (),
        timeout: float = START_TIMEOUT,
    ) -> TemporaryCluster:
        """Copy this running cluster into ``root`` and start the copy as a hot standby.

        ``pg_basebackup -R -X stream`` writes ``standby.signal`` and a ``primary_conninfo``
        through this cluster's unix socket, so the replica streams from it whatever
        network namespace either runs in. This cluster needs :data:`REPLICATION_SETTINGS`.
        The replica listens on ``listen_addresses`` (default: this cluster's), on
        ``port``; ``settings`` are added to its copy of ``postgresql.conf``.
        """
        if not self._running:
            raise ClusterError("a replica is copied from a running cluster: start() it first")
        bindir, socket_dir, owns = self._prepare_root(root)
        replica = TemporaryCluster(
            root,
            port=port,
            listen_addresses=self.listen_addresses
            if listen_addresses is None
            else listen_addresses,
            socket_dir=socket_dir,
            bindir=bindir,
            primary=self,
            owns_socket_dir=owns,
        )
        _hand_over(root)
        _run(
            _command(
                bindir,
                "pg_basebackup",
                "-D",
                str(replica.data_dir),
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
                "-h",
                str(self.socket_dir),
                "-p",
                str(self.port),
                "-U",
                "postgres",
            ),
            timeout=COMMAND_TIMEOUT,
            cwd=root,
        )
        replica._write_settings({"hot_standby": "on", **(settings or {})})
        replica.start(wrapper, timeout=timeout)
        return replica

    def in_recovery(self) -> bool:
        """True on a standby (``pg_is_in_recovery()``)."""
        return bool(self.execute_sql("SELECT pg_is_in_recovery()")[0][0])

    def wait_for_replay(self, lsn: str | None = None, *, timeout: float = 15.0) -> str:
        """Wait until this replica has replayed its primary's WAL up to ``lsn``.

        ``lsn`` defaults to the primary's current WAL flush position, read now: everything
        committed on the primary before this call (with ``synchronous_commit`` on, as
        :data:`BASE_SETTINGS` leaves it) is then visible here. Replay must not be
        paused (``pg_wal_replay_pause()``), or this waits the whole ``timeout``. Returns that LSN;
        raises :class:`ClusterError` after ``timeout`` seconds.
        """
        if lsn is None:
            if self.primary is None:
                raise ClusterError("wait_for_replay needs an lsn, or a replica of a cluster")
            # The flush position: what a walsender may send. (The insert position may lie
            # past a page header that nothing ever fills, on an idle primary.)
            lsn = str(self.primary.execute_sql("SELECT pg_current_wal_flush_lsn()")[0][0])
        deadline = time.monotonic() + timeout
        replayed = None
        while True:
            rows = self.execute_sql(
                "SELECT pg_last_wal_replay_lsn(), "
                f"coalesce(pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn, false)"
            )
            replayed, done = rows[0]
            if done:
                return lsn
            if time.monotonic() >= deadline:
                raise ClusterError(
                    f"replica on port {self.port} replayed up to {replayed}, not {lsn}, "
                    f"within {timeout:.0f}s\n--- replica log ---\n{self.log()}"
                )
            time.sleep(0.02)

    def __repr__(self) -> str:
        role = "replica" if self.primary is not None else "cluster"
        return f"<TemporaryCluster {role} port={self.port} root={self.root}>"


@atexit.register
def _stop_leftovers() -> None:
    """Stop the clusters a crashed or interrupted test left running."""
    with _RUNNING_LOCK:
        leftovers = list(_RUNNING)
    for cluster in leftovers:
        with contextlib.suppress(Exception):
            cluster.stop(timeout=5.0)
