"""Simulated hosts as Linux network namespaces: one server namespace with a bridge, and one
namespace per host, each linked to that bridge by its own veth pair.

Used by ``tests/acceptance/test_multihost.py`` and ``bench/multihost.py``. The layout::

    sqqt-db   bridge sqqt-br, 10.213.57.1/24 (the PostgreSQL server listens here)
      +-- sqqt-h0p  <== veth ==>  sqqt-h0  in namespace sqqt-h0, 10.213.57.11/24
      +-- sqqt-h1p  <== veth ==>  sqqt-h1  in namespace sqqt-h1, 10.213.57.12/24
      ...

Everything is made inside namespaces this module creates: the root namespace gets no
interface, no address and no route, and no namespace has a default route, so traffic from
the hosts can only reach addresses of these namespaces (and each namespace's loopback).
:meth:`Topology.create` checks that before it returns. Cutting a host is
``ip link set <its veth> down`` inside its namespace (:meth:`Topology.cut`).

Every name starts with :data:`PREFIX`. One topology exists at a time on a machine: a lock
file (:data:`LOCK_PATH`) is held for its whole life, and the namespaces a crashed run left
behind are removed (their processes killed) when the next one starts. Deleting a namespace
deletes its veth ends and the bridge with it. Every command and every wait is bounded.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO

__all__ = [
    "DB_ADDRESS",
    "DB_NAMESPACE",
    "LOCK_PATH",
    "PREFIX",
    "SUBNET",
    "Host",
    "NetnsError",
    "Topology",
    "namespaces_left",
    "netns_skip_reason",
    "remove_stale",
    "topology",
]

#: Every namespace (and interface) this module makes starts with this.
PREFIX = "sqqt-"
#: The private /24 of the test network (an unusual one: nothing else on a machine uses it).
SUBNET = "10.213.57"
DB_NAMESPACE = f"{PREFIX}db"
BRIDGE = f"{PREFIX}br"
DB_ADDRESS = f"{SUBNET}.1"
#: Held (flock) for a topology's whole life: runs on one machine take turns.
LOCK_PATH = Path("/tmp") / f"{PREFIX}netns.lock"
#: Seconds any single ``ip`` command may take.
COMMAND_TIMEOUT = 20.0
#: Seconds to wait for the lock before giving up.
LOCK_TIMEOUT = 600.0
#: Seconds to wait for the processes of a namespace to die after SIGKILL.
KILL_TIMEOUT = 10.0


#: Where progress messages go.
Say = Callable[[str], None]


class NetnsError(RuntimeError):
    """An ``ip`` command failed (the message holds its output)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip args...`` (bounded); raise :class:`NetnsError` on failure when ``check``."""
    try:
        done = subprocess.run(
            ["ip", *args],
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise NetnsError(f"ip {' '.join(args)}: no answer within {COMMAND_TIMEOUT:.0f}s") from exc
    if check and done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def netns_skip_reason() -> str | None:
    """Why namespaces cannot be made here, or None when they can.

    Needs Linux, root, the ``ip`` command, and a kernel that lets it make a namespace, a
    bridge and a veth pair (tried in a throwaway namespace, deleted again).
    """
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs this test as root)"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    probe = f"{PREFIX}probe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except NetnsError as exc:
        return f"cannot make a network namespace: {exc}"
    try:
        _ip("-n", probe, "link", "add", f"{PREFIX}pbr", "type", "bridge")
        _ip(
            "-n", probe, "link", "add", f"{PREFIX}pa", "type", "veth", "peer", "name", f"{PREFIX}pb"
        )
    except NetnsError as exc:
        return f"cannot make a bridge or a veth pair in a network namespace: {exc}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


def _namespaces() -> list[str]:
    done = _ip("netns", "list", check=False)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def _pids(namespace: str) -> list[int]:
    done = _ip("netns", "pids", namespace, check=False)
    return [int(word) for word in done.stdout.split() if word.isdigit()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead for our purposes (its parent reaps it).
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def kill_namespace_processes(namespace: str, timeout: float = KILL_TIMEOUT) -> int:
    """SIGKILL every process of ``namespace``; wait (boundedly) until they are gone.

    Returns how many were killed. Only for namespaces this module made (they hold nothing
    but the test's own processes).
    """
    pids = _pids(namespace)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(pids)


def remove_stale(say: Say | None = None) -> list[str]:
    """Remove the namespaces (and their processes) an earlier run left behind.

    Call with the lock held (:class:`Topology` does). Returns the names removed.
    """
    removed = []
    for name in _namespaces():
        if name.startswith(PREFIX):
            killed = kill_namespace_processes(name)
            _ip("netns", "del", name, check=False)
            removed.append(name)
            if say is not None:
                say(f"removed stale namespace {name} ({killed} processes killed)")
    return removed


@dataclass(frozen=True)
class Host:
    """One simulated host: a namespace, its end of a veth pair, its address."""

    name: str
    namespace: str
    #: The veth end inside the host's namespace (what :meth:`Topology.cut` downs).
    link: str
    #: The other end, inside the server's namespace, a port of the bridge.
    peer: str
    address: str

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]


@dataclass
class Topology:
    """The server namespace, its bridge, and ``hosts`` host namespaces linked to it.

    Use as a context manager (or call :meth:`destroy`): leaving it kills every process
    left in the namespaces and deletes them, even after a failure.
    """

    hosts: list[Host] = field(default_factory=list)
    db_namespace: str = DB_NAMESPACE
    db_address: str = DB_ADDRESS
    _lock: IO[bytes] | None = None
    _made: list[str] = field(default_factory=list)

    @classmethod
    def create(cls, hosts: int, *, say: Say | None = None) -> Topology:
        """Take the lock, remove stale leftovers, and build the network for ``hosts`` hosts."""
        if not 1 <= hosts <= 50:
            raise ValueError(f"hosts must be 1 to 50, got {hosts}")
        topology = cls()
        topology._take_lock()
        try:
            remove_stale(say)
            topology._build(hosts)
        except BaseException:
            topology.destroy()
            raise
        return topology

    @property
    def db_wrapper(self) -> list[str]:
        """The command prefix that runs a program inside the server's namespace."""
        return ["ip", "netns", "exec", self.db_namespace]

    def _take_lock(self) -> None:
        handle = open(LOCK_PATH, "ab")  # noqa: SIM115 (held until destroy)
        deadline = time.monotonic() + LOCK_TIMEOUT
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    handle.close()
                    raise NetnsError(
                        f"another run has held {LOCK_PATH} for {LOCK_TIMEOUT:.0f}s"
                    ) from None
                time.sleep(0.2)
        self._lock = handle

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self._made.append(name)
        # IPv4 only: no IPv6 link-local chatter (router solicitations, DAD) on the links.
        # Best effort: a kernel without IPv6 has nothing to turn off.
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    name,
                    "sysctl",
                    "-q",
                    "-w",
                    "net.ipv6.conf.all.disable_ipv6=1",
                    "net.ipv6.conf.default.disable_ipv6=1",
                ],
                capture_output=True,
                timeout=COMMAND_TIMEOUT,
                check=False,
            )
        _ip("-n", name, "link", "set", "lo", "up")

    def _build(self, count: int) -> None:
        db = self.db_namespace
        self._add_namespace(db)
        _ip("-n", db, "link", "add", BRIDGE, "type", "bridge")
        _ip("-n", db, "addr", "add", f"{self.db_address}/24", "dev", BRIDGE)
        _ip("-n", db, "link", "set", BRIDGE, "up")
        for i in range(count):
            host = Host(
                name=f"h{i}",
                namespace=f"{PREFIX}h{i}",
                link=f"{PREFIX}h{i}",
                peer=f"{PREFIX}h{i}p",
                address=f"{SUBNET}.{11 + i}",
            )
            self._add_namespace(host.namespace)
            # Both ends are made where they live: nothing passes through the root namespace.
            _ip(
                "-n",
                db,
                "link",
                "add",
                host.peer,
                "type",
                "veth",
                "peer",
                "name",
                host.link,
                "netns",
                host.namespace,
            )
            _ip("-n", db, "link", "set", host.peer, "master", BRIDGE, "up")
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", host.link)
            _ip("-n", host.namespace, "link", "set", host.link, "up")
            self.hosts.append(host)
        self._check_isolated()

    def _check_isolated(self) -> None:
        """No namespace of ours routes anywhere but the test /24 (no default route)."""
        for name in self._made:
            routes = _ip("-n", name, "route", "show").stdout.splitlines()
            for route in routes:
                if not route.startswith(f"{SUBNET}.0/24 "):
                    raise NetnsError(f"namespace {name} has a route outside the test net: {route}")

    def cut(self, host: Host) -> None:
        """Take ``host``'s link down: it can reach nothing until :meth:`restore`."""
        _ip("-n", host.namespace, "link", "set", host.link, "down")

    def unread_bytes(self, host: Host) -> int:
        """Bytes from ``host`` that the server's sockets hold and no backend has read yet.

        A backend that the scheduler has not run since the host's last packet arrived
        looks idle in ``pg_stat_activity`` while that packet waits in its socket: only the
        socket's receive queue tells.
        """
        listed = subprocess.run(
            [*self.db_wrapper, "ss", "-Htn", "dst", host.address],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout
        # Columns: State Recv-Q Send-Q Local:Port Peer:Port
        return sum(int(line.split()[1]) for line in listed.splitlines() if line.strip())

    def restore(self, host: Host) -> None:
        """Bring ``host``'s link back up (its address and route come back with it)."""
        _ip("-n", host.namespace, "link", "set", host.link, "up")

    def destroy(self) -> None:
        """Kill what runs in the namespaces, delete them, release the lock. Idempotent."""
        try:
            for name in reversed(self._made):
                kill_namespace_processes(name)
                _ip("netns", "del", name, check=False)
            self._made.clear()
        finally:
            if self._lock is not None:
                with contextlib.suppress(OSError):
                    fcntl.flock(self._lock, fcntl.LOCK_UN)
                self._lock.close()
                self._lock = None

    def __enter__(self) -> Topology:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.destroy()


def namespaces_left() -> list[str]:
    """Namespaces with :data:`PREFIX` that exist right now (none, after a clean run)."""
    return [name for name in _namespaces() if name.startswith(PREFIX)]


@contextlib.contextmanager
def topology(hosts: int, *, say: Say | None = None) -> Iterator[Topology]:
    """:meth:`Topology.create` as a ``with`` block."""
    made = Topology.create(hosts, say=say)
    try:
        yield made
    finally:
        made.destroy()
