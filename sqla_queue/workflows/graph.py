"""A workflow as the application builds it: nodes, what each waits for, and its rows.

Nothing here touches the database. :class:`Workflow` collects calls (``task.call(...)``)
into nodes, each after the nodes it names, so the graph has no cycle by construction;
:func:`node_rows` checks every call and turns the graph into the rows that
:func:`~sqla_queue.statements.workflows.write_nodes_statement` writes in one statement.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from sqla_queue.enqueue import TaskDefaults, job_row
from sqla_queue.links import about_reference
from sqla_queue.logic.payload import dump_payloads, text_problem
from sqla_queue.models.tables import ParentFailure, ParentPolicy
from sqla_queue.spec import JobSpec
from sqla_queue.statements.workflows import NodeRow
from sqla_queue.workflows.results import WorkflowHandle

__all__ = [
    "EXPANSION_SEPARATOR",
    "Expansion",
    "Node",
    "Policy",
    "Quorum",
    "Workflow",
    "dump_node_rows",
    "empty_message",
    "node_rows",
    "quorum",
]

#: The longest name of a workflow or of one of its nodes, in characters.
MAX_NAME = 200


@dataclass(frozen=True)
class Quorum:
    """The policy of a node that runs once ``count`` of its parents succeeded."""

    count: int


def quorum(count: int) -> Quorum:
    """``policy=quorum(n)``: run the node once ``n`` of its parents succeeded.

    When so many parents failed that ``n`` can no longer succeed, the node is cancelled
    (or held, with ``on_parent_failure="hold"``).
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"quorum needs a whole number of parents, 1 or more, got {count!r}")
    return Quorum(count)


#: What a node needs of its parents: ``"all_succeeded"`` (the default), ``"all_finished"``
#: or :func:`quorum`.
Policy = str | Quorum


@dataclass(frozen=True)
class Node:
    """A node of a workflow, as :meth:`Workflow.add` returns it: pass it to ``after=``."""

    workflow: Workflow = field(repr=False, compare=False)
    index: int
    name: str


@dataclass
class _Entry:
    spec: JobSpec
    name: str
    after: tuple[int, ...]
    policy: str
    quorum: int | None
    on_parent_failure: str


#: What joins an expanding node's name to the names of the nodes its expansion adds
#: (``plan/pack@0``, ``plan/pack@then``): no name a caller gives has it.
EXPANSION_SEPARATOR = "/"


def _check_name(what: str, name: object) -> str:
    if not isinstance(name, str) or not name or len(name) > MAX_NAME:
        raise ValueError(
            f"{what} must be a non-empty text of at most {MAX_NAME} characters, got {name!r}"
        )
    problem = text_problem(name)
    if problem is not None:
        raise ValueError(f"{what} {name!r} {problem}")
    return name


def _check_node_name(name: object) -> str:
    checked = _check_name("a node's name", name)
    if EXPANSION_SEPARATOR in checked:
        raise ValueError(
            f"a node's name cannot contain {EXPANSION_SEPARATOR!r}, got {checked!r}: the "
            "nodes that an expansion (ctx.expand) adds are named "
            "'<expanding node>/<task>@<n>', and a node named so would take one's place"
        )
    return checked


def _policy(policy: object, parents: int) -> tuple[str, int | None]:
    if isinstance(policy, Quorum):
        if parents == 0:
            raise ValueError("policy=quorum(...) needs a node with parents (after=...)")
        if policy.count > parents:
            raise ValueError(
                f"policy=quorum({policy.count}) asks for more parents than the node has ({parents})"
            )
        return ParentPolicy.QUORUM, policy.count
    if policy in (ParentPolicy.ALL_SUCCEEDED, ParentPolicy.ALL_FINISHED):
        return str(policy), None
    raise ValueError(f"policy must be 'all_succeeded', 'all_finished' or quorum(n), got {policy!r}")


def _failure(value: object) -> str:
    if value not in ParentFailure.ALL:
        raise ValueError(f"on_parent_failure must be 'cancel' or 'hold', got {value!r}")
    return str(value)


def _spec(spec: object) -> JobSpec:
    if isinstance(spec, Workflow):
        raise TypeError(
            f"add() takes one call, got the workflow {spec.name!r}: add a whole shape "
            "(queue.chain, queue.group, queue.chord) with workflow.include(shape, after=...), "
            "which returns its last nodes"
        )
    if not isinstance(spec, JobSpec):
        raise TypeError(
            f"a workflow's node is a call, such as send_email.call(to=...), got {spec!r}"
        )
    if spec.options.is_unique or spec.options.on_duplicate or spec.options.unique_scope:
        raise ValueError(
            f"a workflow node ({spec.task}) cannot take a unique_key: give the workflow "
            "unique=True to keep one live workflow per row"
        )
    return spec


def empty_message(name: str) -> str:
    """What the enqueue of a workflow without nodes says."""
    return (
        f"workflow {name!r} has no nodes, so there is nothing to enqueue: add each call "
        "with workflow.add(task.call(...)) (or build it with queue.chain, queue.group or "
        "queue.chord), then enqueue it"
    )


class Workflow:
    """A graph of calls, enqueued together in the caller's transaction.

    ``name`` names the kind of workflow (``"fulfil"``); ``about`` links it to the
    application's row as ``task.options(about=...)`` links a job; with ``unique=True``,
    :meth:`enqueue` writes nothing while a live workflow of this name about this row
    exists, and returns that one's handle. Nodes are added with :meth:`add`, each after
    the nodes it names; :meth:`enqueue` writes them all in one statement.
    """

    def __init__(
        self, name: str = "workflow", *, about: object = None, unique: bool = False
    ) -> None:
        self.name = _check_name("a workflow's name", name)
        self.about = None if about is None else about_reference(about)
        if not isinstance(unique, bool):
            raise TypeError(f"unique must be True or False, got {unique!r}")
        if unique and self.about is None:
            raise ValueError("unique=True needs about=...: one live workflow per row")
        self.unique = unique
        self._entries: list[_Entry] = []
        self._names: dict[str, int] = {}
        self._counts: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"<Workflow {self.name!r}: {len(self._entries)} nodes>"

    def __len__(self) -> int:
        return len(self._entries)

    def add(
        self,
        spec: JobSpec,
        *,
        after: Node | Iterable[Node] | None = None,
        name: str | None = None,
        policy: Policy = ParentPolicy.ALL_SUCCEEDED,
        on_parent_failure: str = ParentFailure.CANCEL,
    ) -> Node:
        """Add a node that runs ``spec`` after the nodes ``after``; its :class:`Node`.

        ``name`` is unique in the workflow (by default the task's name, numbered from the
        second node of one task: ``resize``, ``resize#2``, ...). ``policy`` says what the
        node needs of its parents, ``on_parent_failure`` what a parent's failure does to it.
        """
        spec = _spec(spec)
        parents = self._parents(after)
        rule, count = _policy(policy, len(parents))
        failure = _failure(on_parent_failure)
        node_name = self._name_for(spec.task, name)
        index = len(self._entries)
        self._entries.append(_Entry(spec, node_name, parents, rule, count, failure))
        self._names[node_name] = index
        return Node(self, index, node_name)

    def _parents(self, after: Node | Iterable[Node] | None) -> tuple[int, ...]:
        if after is None:
            return ()
        nodes = [after] if isinstance(after, Node) else list(after)
        for node in nodes:
            if not isinstance(node, Node):
                raise TypeError(f"after= takes nodes that add() returned, got {node!r}")
            if node.workflow is not self:
                raise ValueError(f"node {node.name!r} belongs to another workflow")
        # Each parent once, in the order given (a dict keeps it, in linear time).
        return tuple(dict.fromkeys(node.index for node in nodes))

    def _name_for(self, task: str, name: str | None) -> str:
        if name is not None:
            name = _check_node_name(name)
            if name in self._names:
                raise ValueError(f"the workflow has a node named {name!r} already")
            return name
        count = self._counts.get(task, 0) + 1
        while True:
            candidate = task if count == 1 else f"{task}#{count}"
            if candidate not in self._names:
                self._counts[task] = count
                return candidate
            count += 1

    def include(
        self, part: JobSpec | Workflow, *, after: Node | Iterable[Node] | None = None
    ) -> list[Node]:
        """Add ``part`` after the nodes ``after``: a call (one node, as :meth:`add`), or a
        whole workflow (a ``queue.chain``, ``group`` or ``chord``, or any graph), whose
        nodes are copied in with their parents, policies and names (a name taken already
        gets the next free number: ``charge#2``). Its roots wait for ``after``. The part's
        own name, ``about`` and ``unique`` are not used: this workflow's are.

        Returns the part's last nodes, those nothing in it waits for: pass them to the
        next ``after=``. This is how shapes nest: step, then a fan-out with a callback,
        then a step.
        """
        if isinstance(part, JobSpec):
            return [self.add(part, after=after)]
        if not isinstance(part, Workflow):
            raise TypeError(
                "a workflow's part is a call, such as send_email.call(to=...), or a "
                f"workflow (queue.chain, queue.group, queue.chord), got {part!r}"
            )
        if part is self:
            raise ValueError("a workflow cannot include itself")
        if not part._entries:
            raise ValueError(empty_message(part.name))
        roots = self._parents(after)
        placed: list[int] = []
        for entry in part._entries:
            parents = tuple(placed[i] for i in entry.after) if entry.after else roots
            index = len(self._entries)
            name = self._free_name(entry.name)
            self._entries.append(
                _Entry(
                    entry.spec, name, parents, entry.policy, entry.quorum, entry.on_parent_failure
                )
            )
            self._names[name] = index
            placed.append(index)
        return [
            Node(self, placed[node.index], self._entries[placed[node.index]].name)
            for node in part.last_nodes
        ]

    def _free_name(self, name: str) -> str:
        """``name``, or else ``base#n`` with the smallest n from 2 that no node has
        (``base`` is ``name`` without its own ``#n``: ``resize#2`` becomes ``resize#3``)."""
        if name not in self._names:
            return name
        base, mark, number = name.rpartition("#")
        if not (mark and base and number.isdigit()):
            base = name
        count = 2
        while f"{base}#{count}" in self._names:
            count += 1
        return f"{base}#{count}"

    @property
    def nodes(self) -> list[Node]:
        """The nodes, in the order they were added."""
        return [Node(self, i, entry.name) for i, entry in enumerate(self._entries)]

    @property
    def last_nodes(self) -> list[Node]:
        """The nodes no other node waits for, in the order they were added: what a step
        after this whole graph waits for."""
        waited_for = {parent for entry in self._entries for parent in entry.after}
        return [
            Node(self, i, entry.name)
            for i, entry in enumerate(self._entries)
            if i not in waited_for
        ]

    @overload
    def enqueue(self, session: Session | Connection) -> WorkflowHandle: ...

    @overload
    def enqueue(
        self, session: AsyncSession | AsyncConnection
    ) -> Coroutine[Any, Any, WorkflowHandle]: ...

    def enqueue(
        self, session: Session | Connection | AsyncSession | AsyncConnection
    ) -> WorkflowHandle | Coroutine[Any, Any, WorkflowHandle]:
        """Write the workflow in ``session``'s transaction; a
        :class:`~sqla_queue.workflows.WorkflowHandle` (a coroutine of it for an async bind).

        The queue is the one of the nodes' tasks (``task.call(...)``); a workflow of
        specs built by name is enqueued by ``queue.enqueue_workflow(session, wf)``.
        """
        if not self._entries:
            raise ValueError(empty_message(self.name))
        origins = {id(e.spec.origin): e.spec.origin for e in self._entries if e.spec.origin}
        if len(origins) != 1:
            raise ValueError(
                "this workflow's nodes do not name one queue (build them with task.call(...) "
                "of one queue, or call queue.enqueue_workflow(session, workflow))"
            )
        (enqueuer,) = origins.values()
        written: WorkflowHandle | Coroutine[Any, Any, WorkflowHandle]
        written = enqueuer.workflows.enqueue(session, self)
        return written

    def entries(self) -> list[tuple[JobSpec, str, tuple[int, ...], str, int | None, str]]:
        """Each node as ``(spec, name, parents, policy, quorum, on_parent_failure)``."""
        return [
            (e.spec, e.name, e.after, e.policy, e.quorum, e.on_parent_failure)
            for e in self._entries
        ]


@dataclass(frozen=True)
class Expansion:
    """What a running node asked ``ctx.expand`` to add: ``calls``, then ``then`` after
    them all; the expanding job's dependents wait for ``then`` (or for every call)."""

    calls: tuple[JobSpec, ...]
    then: JobSpec | None = None

    def workflow(self) -> Workflow:
        """The expansion as a graph of its own nodes (the expanding job is not one)."""
        graph = Workflow("expansion")
        parts = [graph.add(spec, name=f"{spec.task}@{i}") for i, spec in enumerate(self.calls)]
        if self.then is not None:
            graph.add(self.then, after=parts, name=f"{self.then.task}@then")
        return graph


def node_rows(
    workflow: Workflow,
    defaults_for: Callable[[str], TaskDefaults],
    *,
    after_jobs: Sequence[int] = (),
    prefix: str = "",
) -> list[NodeRow]:
    """The rows of ``workflow``'s nodes, every call checked before any row is returned.

    ``after_jobs`` are existing jobs that every root of ``workflow`` waits for (an
    expansion's expanding job); ``prefix`` goes before each node's name.
    """
    rows: list[NodeRow] = []
    for seq, (spec, name, after, policy, count, failure) in enumerate(workflow.entries()):
        job = job_row(spec, defaults_for(spec.task), seq)
        row: NodeRow = {
            "seq": seq,
            "name": prefix + name,
            "task": job["task"],
            "payload": job["payload"],
            "priority": job["priority"],
            "queue_id": job["queue_id"],
            "max_attempts": job["max_attempts"],
            "run_at": job["run_at"],
            "delay": job["delay"],
            "after": list(after),
            "after_jobs": [] if after else list(after_jobs),
            "policy": policy,
            "quorum": count,
            "on_parent_failure": failure,
        }
        if "about_table" in job:
            row["about_table"], row["about_key"] = job["about_table"], job["about_key"]
        rows.append(row)
    return rows


def dump_node_rows(rows: list[NodeRow]) -> str:
    """The JSON text of ``rows``, each payload checked as an enqueue checks it."""
    count = len(rows)
    return dump_payloads(
        rows,
        lambda: ((row["payload"], row["task"]) for row in rows),
        objects=3 * count,
        arrays=3 * count + 1,
    )
