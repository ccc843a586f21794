"""The accounting of a workflow stress run (:mod:`tests.support.workflow_stress`).

:func:`verify_stress` reads the nodes, edges, jobs and recorded runs after the drain and
checks, DAG by DAG: the graph is the planned one with exactly the expansions of the
expanders that succeeded; every node is in the state its parents' final outcomes imply
(:func:`decide`) and its job's status goes with it; every edge carries its parent's final
outcome and result; every run saw exactly its parents' results; no node that was never
released ran, and no attempt ran more than once unless a SIGKILL explains it; and
``queue.workflow_status`` agrees.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

from tests.support.chaos import WorkerLife
from tests.support.workflow_stress import (
    TASK,
    PlannedNode,
    StressRun,
    queue,
    remaining,
    result_of,
    table_sql,
)

__all__ = ["StressReport", "decide", "expected_graph", "summary", "verify_stress"]

_NODES_SQL = (
    "SELECT n.workflow_id, n.job_id, n.name, n.state, n.policy, n.quorum, "
    "n.on_parent_failure, n.parents, j.status, j.attempts, j.result, j.errors "
    "FROM {s}.{p}workflow_nodes n LEFT JOIN {s}.{p}jobs j ON j.id = n.job_id"
)
_EDGES_SQL = "SELECT child_id, parent_id, outcome, result FROM {s}.{p}workflow_edges"


@dataclass
class StressReport:
    """The accounting of a run; ``problems`` is empty when everything adds up."""

    nodes: int = 0
    expansions: int = 0
    states: Counter[str] = field(default_factory=Counter)
    policies: Counter[str] = field(default_factory=Counter)
    runs: int = 0
    callback_runs: int = 0
    extra_by_kill: int = 0
    #: Executions that saw a parent's outcome from before that parent's requeue.
    stale_after_requeue: int = 0
    #: Nodes whose outcome differs from their mode because of the faults (explained).
    outcome_by_fault: int = 0
    workflow_states: Counter[str] = field(default_factory=Counter)
    error_types: Counter[str] = field(default_factory=Counter)
    log_counts: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)

    def problem(self, message: str) -> None:
        """Note one discrepancy."""
        self.problems.append(message)


@dataclass
class _Node:
    """One node as the database holds it."""

    workflow_id: int
    job_id: int
    name: str
    state: str
    policy: str
    quorum: int | None
    on_parent_failure: str
    parents_count: int
    status: str | None
    attempts: int | None
    result: Any
    errors: list[dict[str, Any]]


@dataclass(frozen=True)
class _Run:
    job_id: int
    round: int
    attempt: int
    pid: int
    name: str
    seen: dict[str, Any]
    started_at: float


@dataclass
class _Expected:
    """A node of the expected final graph: its plan (or its expansion's), its parents."""

    name: str
    mode: str
    parents: list[str]
    policy: str
    quorum: int | None
    on_parent_failure: str
    expands: PlannedNode | None = None
    #: Each parent as written, and the nodes an expansion of that parent hands the edge
    #: over to (itself when it did not expand). A node that ran before its parent was
    #: requeued (and then expanded) keeps that parent, with the outcome it ran on.
    moves: dict[str, list[str]] = field(default_factory=dict)


def expected_graph(planned: list[PlannedNode], succeeded: set[str]) -> dict[str, _Expected]:
    """The final graph of one DAG: the plan, with the expansion of every expander that
    ``succeeded`` (its calls after it, ``then`` after them) and its dependents moved onto
    the expansion's last nodes."""
    graph: dict[str, _Expected] = {}
    sinks: dict[str, list[str]] = {}
    for node in planned:
        graph[node.name] = _Expected(
            node.name,
            node.mode,
            list(node.parents),
            node.policy,
            node.quorum,
            node.on_parent_failure,
            node if node.expands else None,
        )
        if node.expands and node.name in succeeded:
            calls = [f"{node.name}/{TASK}@{i}" for i in range(len(node.parts or ()))]
            for call, mode in zip(calls, node.parts or (), strict=True):
                graph[call] = _Expected(call, mode, [node.name], "all_succeeded", None, "cancel")
            if node.then is not None:
                last = f"{node.name}/{TASK}@then"
                graph[last] = _Expected(last, node.then, calls, "all_succeeded", None, "cancel")
                sinks[node.name] = [last]
            else:
                sinks[node.name] = calls
    for entry in graph.values():
        moved: list[str] = []
        for parent in entry.parents:
            is_own_call = entry.name.startswith(parent + "/")
            entry.moves[parent] = [parent] if is_own_call else sinks.get(parent, [parent])
            moved += entry.moves[parent]
        entry.parents = moved
    return graph


def decide(policy: str, need: int | None, on_failure: str, statuses: Iterable[str | None]) -> str:
    """The state a node's parents' final job statuses imply (``released``, ``cancelled``,
    ``held`` or ``blocked``): the policies as documented."""
    statuses = list(statuses)
    if not statuses:
        return "released"
    open_ = sum(1 for s in statuses if s not in ("succeeded", "failed", "cancelled"))
    ok = statuses.count("succeeded")
    bad = len(statuses) - open_ - ok
    ruled_out = "held" if on_failure == "hold" else "cancelled"
    if policy == "all_finished":
        return "released" if open_ == 0 else "blocked"
    if policy == "quorum":
        assert need is not None
        if ok >= need:
            return "released"
        return ruled_out if ok + open_ < need else "blocked"
    if bad:
        return ruled_out
    return "released" if open_ == 0 else "blocked"


def _load(engine: Engine) -> tuple[list[_Node], list[Any], list[_Run], dict[int, int]]:
    with engine.connect() as conn:
        nodes = [
            _Node(
                r.workflow_id,
                r.job_id,
                r.name,
                r.state,
                r.policy,
                r.quorum,
                r.on_parent_failure,
                r.parents,
                r.status,
                r.attempts,
                r.result,
                r.errors or [],
            )
            for r in conn.execute(text(table_sql(_NODES_SQL)))
        ]
        edges = list(conn.execute(text(table_sql(_EDGES_SQL))).all())
        runs = [
            _Run(r[0], r[1], r[2], r[3], r[4], r[5], float(r[6]))
            for r in conn.execute(
                text(
                    "SELECT job_id, round, attempt, pid, name, seen, "
                    "extract(epoch FROM started_at) FROM wfs_runs ORDER BY id"
                )
            )
        ]
        heal = {int(r[0]): int(r[1]) for r in conn.execute(text("SELECT * FROM wfs_heal"))}
    return nodes, edges, runs, heal


def _last_error_type(node: _Node) -> str | None:
    if not node.errors:
        return None
    last = node.errors[-1]
    return last.get("type", last.get("error"))


class _Verifier:
    """The checks of :func:`verify_stress`, over what :func:`_load` read."""

    def __init__(self, run: StressRun, engine: Engine, report: StressReport) -> None:
        self.run = run
        self.engine = engine
        self.report = report
        nodes, edges, runs, self.heal = _load(engine)
        self.by_job = {n.job_id: n for n in nodes}
        self.by_workflow: dict[int, dict[str, _Node]] = defaultdict(dict)
        for node in nodes:
            self.by_workflow[node.workflow_id][node.name] = node
        self.edges: dict[int, list[Any]] = defaultdict(list)
        for edge in edges:
            self.edges[edge.child_id].append(edge)
        self.runs: dict[int, list[_Run]] = defaultdict(list)
        for r in runs:
            self.runs[r.job_id].append(r)
        self.requeued = {job for batch in run.requeues for job in batch}
        #: Per job, the parents accepted for it (see check_node).
        self.accepted_parents: dict[int, list[str]] = {}
        self.lives_by_pid: dict[int, list[WorkerLife]] = defaultdict(list)
        for life in run.lives:
            self.lives_by_pid[life.pid].append(life)

    def check(self) -> None:
        report = self.report
        known = set(self.run.workflow_ids)
        if set(self.by_workflow) != known:
            report.problem(f"workflows in the database {sorted(self.by_workflow)[:5]}... differ")
        strays = set(self.runs) - set(self.by_job)
        if strays:
            report.problem(f"runs recorded for {len(strays)} jobs that are no node")
        for index, (wf_id, planned) in enumerate(
            zip(self.run.workflow_ids, self.run.dags, strict=True)
        ):
            self.check_dag(index, wf_id, planned)

    def check_dag(self, index: int, wf_id: int, planned: list[PlannedNode]) -> None:
        report = self.report
        where = f"dag {index} (workflow {wf_id})"
        actual = self.by_workflow.get(wf_id, {})
        succeeded = {name for name, n in actual.items() if n.status == "succeeded"}
        graph = expected_graph(planned, succeeded)
        if set(graph) != set(actual):
            missing, extra = sorted(set(graph) - set(actual)), sorted(set(actual) - set(graph))
            report.problem(f"{where}: nodes missing {missing[:5]}, unexpected {extra[:5]}")
            return
        report.nodes += len(graph)
        report.expansions += len(graph) - len(planned)
        touched = self.requeue_touched(actual)
        shown: dict[str, str] = {}
        for name, want in graph.items():
            node = actual[name]
            shown[name] = node.state if node.state in ("blocked", "held") else str(node.status)
            self.check_node(where, want, node, actual, touched)
        self.check_status(where, wf_id, graph, actual, shown)

    def requeue_touched(self, actual: dict[str, _Node]) -> set[str]:
        """Names of the nodes requeued, and of every node below them."""
        children: dict[int, list[int]] = defaultdict(list)
        for node in actual.values():
            for edge in self.edges.get(node.job_id, []):
                children[edge.parent_id].append(node.job_id)
        todo = [n.job_id for n in actual.values() if n.job_id in self.requeued]
        seen: set[int] = set()
        while todo:
            job = todo.pop()
            if job not in seen:
                seen.add(job)
                todo += children.get(job, [])
        return {self.by_job[j].name for j in seen}

    def check_node(
        self,
        where: str,
        want: _Expected,
        node: _Node,
        actual: dict[str, _Node],
        touched: set[str],
    ) -> None:
        report = self.report
        here = f"{where} node {node.name} (job {node.job_id})"
        report.states[node.state if node.state != "released" else str(node.status)] += 1
        report.policies[node.policy] += 1
        for entry in node.errors:
            report.error_types[str(entry.get("type", entry.get("error")))] += 1
        # The graph as written: parents, policy, counts.
        edges = self.edges.get(node.job_id, [])
        parents = {self.by_job[e.parent_id].name: e for e in edges}
        # A node that ran keeps the edges it ran on: a parent requeued after that, which
        # then expands, hands over only its open edges (see resume_statement).
        ran_before_requeue = node.name in touched and node.state == "released"
        want_parents = want.parents
        if ran_before_requeue:
            want_parents = []
            for written, moved_to in want.moves.items():
                kept = written in touched and written in parents and written not in moved_to
                want_parents += [written] if kept else moved_to
        self.accepted_parents[(node.job_id)] = want_parents
        if sorted(parents) != sorted(want_parents) or len(edges) != len(want_parents):
            report.problem(f"{here}: parents {sorted(parents)}, expected {sorted(want_parents)}")
            return
        if node.parents_count != len(edges):
            report.problem(f"{here}: parents column {node.parents_count}, {len(edges)} edges")
        if (node.policy, node.quorum, node.on_parent_failure) != (
            want.policy,
            want.quorum,
            want.on_parent_failure,
        ):
            report.problem(f"{here}: policy {node.policy}/{node.quorum}/{node.on_parent_failure}")
        # Each edge carries its parent's final outcome (and result).
        for name, edge in parents.items():
            parent = actual[name]
            final = parent.status if parent.status in ("succeeded", "failed", "cancelled") else None
            if edge.outcome != final and ran_before_requeue and name in touched:
                # It ran on the outcome its parent had then; the requeue keeps that edge.
                report.stale_after_requeue += 1
            elif edge.outcome != final:
                report.problem(f"{here}: edge from {name} says {edge.outcome}, parent is {final}")
            elif final == "succeeded" and edge.result != parent.result:
                report.problem(f"{here}: edge from {name} carries {edge.result!r}")
        # The state the parents' outcomes imply, and the job's status that goes with it.
        expected = decide(
            want.policy,
            want.quorum,
            want.on_parent_failure,
            [actual[p].status for p in want_parents],
        )
        if node.state != expected:
            statuses = {p: (actual[p].state, actual[p].status) for p in want_parents}
            report.problem(
                f"{here}: state {node.state}, expected {expected} ({want.policy}"
                f"/{want.quorum}/{want.on_parent_failure}; parents {statuses})"
            )
            return
        runs = self.runs.get(node.job_id, [])
        if node.state == "released":
            if node.status not in ("succeeded", "failed"):
                report.problem(f"{here}: released, but its job is {node.status} after the drain")
            self.check_runs(here, want, node, runs)
            self.check_seen(here, want, node, runs, actual, touched)
        else:
            wanted_status = "cancelled" if node.state == "cancelled" else "queued"
            if node.status != wanted_status:
                report.problem(f"{here}: {node.state} but its job is {node.status}")
            if runs:
                report.problem(f"{here}: {node.state}, yet it ran {len(runs)} time(s)")

    def check_runs(self, here: str, want: _Expected, node: _Node, runs: list[_Run]) -> None:
        """No node ran more often than its attempts and the kills explain, and its
        outcome is its mode's unless a fault explains the difference."""
        report = self.report
        report.runs += len(runs)
        if len(want.parents) > 1:
            report.callback_runs += len(runs)
        for r in runs:
            if r.name != node.name:
                report.problem(f"{here}: a run says it is {r.name}")
        healed = self.heal.get(node.job_id, 0)
        final = [r for r in runs if r.round == healed]
        # An attempt may end before its handler recorded anything: lost too often, or its
        # connection cut; its error then says so.
        last = node.errors[-1] if node.errors else {}
        unrecorded = last.get("attempt") == node.attempts and not str(
            last.get("type", "")
        ).endswith(".DesignedFailure")
        top = max((r.attempt for r in final), default=0)
        if top > (node.attempts or 0):
            report.problem(f"{here}: ran at attempt {top}, its job says {node.attempts}")
        elif top < (node.attempts or 0) and not unrecorded:
            report.problem(
                f"{here}: {node.status} at attempt {node.attempts} of round {healed}, last "
                f"run recorded at attempt {top}, errors {node.errors}"
            )
        # Every run ended its attempt (the job's last one, or one whose failure its errors
        # record), or its worker was SIGKILLed under it: anything else ran once too often.
        by_attempt: dict[tuple[int, int], list[_Run]] = defaultdict(list)
        for r in runs:
            by_attempt[(r.round, r.attempt)].append(r)
        failed_attempts = {e.get("attempt") for e in node.errors}
        for (round_, attempt), group in sorted(by_attempt.items()):
            ended = (round_, attempt) == (healed, node.attempts) or attempt in failed_attempts
            for i, r in enumerate(group):
                if ended and i == len(group) - 1:
                    continue
                if self.killed_during(r):
                    report.extra_by_kill += 1
                else:
                    report.problem(
                        f"{here}: round {round_} attempt {attempt} ran {len(group)} time(s), "
                        f"and neither ended it nor was killed (pid {r.pid})"
                    )
        if node.status == "succeeded" and node.result != result_of(node.name):
            report.problem(f"{here}: result {node.result!r}")
        designed = [e for e in node.errors if e.get("type", "").endswith(".DesignedFailure")]
        faults = [e for e in node.errors if not e.get("type", "").endswith(".DesignedFailure")]
        if want.mode == "ok" and designed:
            report.problem(f"{here}: mode ok, failed by design")
        if want.mode == "flaky" and any(e.get("attempt") != 1 for e in designed):
            report.problem(f"{here}: flaky, failed by design after attempt 1")
        if node.status == "succeeded" and want.mode == "fail" and not healed:
            report.problem(f"{here}: mode fail, yet succeeded unhealed")
        if node.status == "failed" and (healed or want.mode != "fail"):
            if faults:
                report.outcome_by_fault += 1
            else:
                report.problem(f"{here}: failed without a fault to explain it: {node.errors}")

    def killed_during(self, r: _Run) -> bool:
        """Whether ``r``'s process was SIGKILLed, and ``r`` started within its life."""
        return any(
            life.killed and life.covers(r.started_at) for life in self.lives_by_pid.get(r.pid, [])
        )

    def check_seen(
        self,
        here: str,
        want: _Expected,
        node: _Node,
        runs: list[_Run],
        actual: dict[str, _Node],
        touched: set[str],
    ) -> None:
        """Every run saw exactly its parents' outcomes: all of them (a quorum: those that
        had ended, at least ``n`` succeeded), each with the parent's result, or its status
        and last error. A parent requeued after the run may have changed since."""
        report = self.report
        names = set(want.parents)
        for r in runs:
            keys = set(r.seen)
            # A parent requeued after this run may have expanded since: its dependents'
            # edges then moved onto the expansion (resume reopens them, the hand-over
            # moves the open ones), so this run saw a parent it no longer has.
            moved = keys - names
            if moved - touched:
                report.problem(f"{here}: saw {sorted(moved - touched)}, not its parents")
                continue
            report.stale_after_requeue += len(moved)
            missing = names - keys
            if want.policy != "quorum" and missing - touched:
                report.problem(f"{here} run {r.attempt}: did not see {sorted(missing)}")
            succeeded = 0
            for name, value in r.seen.items():
                if name in moved:
                    continue
                parent = actual[name]
                if parent.status == "succeeded":
                    good = value == parent.result
                else:
                    good = value == {"parent": parent.status, "type": _last_error_type(parent)}
                succeeded += value == result_of(name)
                if not good and name in touched:
                    report.stale_after_requeue += 1
                elif not good:
                    report.problem(
                        f"{here} run {r.attempt}: saw {name} as {value!r}; it is "
                        f"{parent.status} {parent.result!r} {_last_error_type(parent)}"
                    )
            if want.policy == "all_succeeded" and succeeded != len(names):
                report.problem(f"{here} run {r.attempt}: ran without all parents succeeded")
            if want.policy == "quorum" and succeeded < (want.quorum or 0):
                report.problem(f"{here} run {r.attempt}: ran with {succeeded} < {want.quorum}")

    def check_status(
        self,
        where: str,
        wf_id: int,
        graph: dict[str, _Expected],
        actual: dict[str, _Node],
        shown: dict[str, str],
    ) -> None:
        """``queue.workflow_status`` shows the same nodes, parents and states, and the
        workflow's state follows from them."""
        report = self.report
        status = queue.workflow_status(self.engine, wf_id)
        report.workflow_states[status.state] += 1
        listed = {n.name: n for n in status.nodes}
        if set(listed) != set(graph):
            report.problem(f"{where}: workflow_status lists other nodes")
            return
        for name, entry in listed.items():
            wanted = self.accepted_parents.get(entry.job_id, graph[name].parents)
            if entry.job_id != actual[name].job_id or sorted(entry.parents) != sorted(wanted):
                report.problem(f"{where}: workflow_status shows {name} as {entry}")
            if entry.shown_state != shown[name]:
                report.problem(f"{where}: {name} shown {entry.shown_state}, is {shown[name]}")
        states = set(shown.values())
        if states & {"blocked", "queued"}:
            expected = "running"
        elif "held" in states:
            expected = "held"
        elif states & {"failed", "cancelled"}:
            expected = "failed"
        else:
            expected = "succeeded"
        if status.state != expected:
            report.problem(f"{where}: workflow state {status.state}, expected {expected}")


#: Worker log lines worth counting: evidence that the faults were felt and survived, and
#: of writes the database refused (a node released twice would be a duplicate key).
_LOG_MARKERS = {
    "database error": "database error during",
    "listen reconnect": "LISTEN connection lost",
    "reclaim sweeps": "lost execution(s) of dead workers",
    "lost while held": "reclaimed by another worker while held here",
    "duplicate key": "duplicate key",
    "fenced": "result discarded",
    "traceback": "Traceback",
    # Two transactions of one workflow waiting for each other: the worker retries, but
    # the release statements' lock order should rule it out (see statements/release.py).
    "deadlock": "deadlock detected",
}


def verify_stress(db_url: str, run: StressRun) -> StressReport:
    """Account for every node, edge and execution of ``run`` (see the module docstring)."""
    report = StressReport()
    engine = create_engine(db_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            executions, _ = remaining(conn)
        if executions:
            report.problem(f"{executions} executions left after the drain")
        _Verifier(run, engine, report).check()
    finally:
        engine.dispose()
    for life in run.lives:
        if life.unexpected:
            report.problem(f"worker pid {life.pid} exited on its own (code {life.returncode})")
        elif not life.killed and life.returncode != 0:
            report.problem(f"worker pid {life.pid} exited with {life.returncode} after SIGTERM")
        log = life.log_path.read_text(errors="replace") if life.log_path.exists() else ""
        for name, marker in _LOG_MARKERS.items():
            report.log_counts[name] += log.count(marker)
    for ids, error in run.requeue_errors:
        report.problem(f"queue.requeue({ids}) raised {error}")
    if report.log_counts["duplicate key"]:
        report.problem("a worker log shows a duplicate key: a node released twice?")
    return report


def summary(run: StressRun, report: StressReport) -> str:
    """A few lines for humans: the seed first, to replay the run."""
    drain = f"{run.drain_seconds:.1f}s" if run.drain_seconds is not None else "did not drain"
    sweeps = ", ".join(f"{n} at {p:.0%}" for p, n in run.terminations) or "none"
    lines = [
        f"seed: {run.config.seed} (replay: SQLA_QUEUE_WFS_SEED={run.config.seed}); "
        f"{len(run.dags)} dags, {report.nodes} nodes ({report.expansions} by expansion); "
        f"drain: {drain}",
        f"node states: {dict(report.states)}; policies: {dict(report.policies)}",
        f"workflow states: {dict(report.workflow_states)}",
        f"runs: {report.runs} ({report.callback_runs} of callbacks), {report.extra_by_kill} "
        f"extra by a SIGKILL; {report.outcome_by_fault} outcomes changed by a fault; "
        f"{report.stale_after_requeue} parent results seen before a requeue",
        f"processes: {len(run.lives)} lives, {len(run.kills)} SIGKILLs; backends "
        f"terminated: {sweeps}; requeued: {sum(map(len, run.requeues))} jobs in "
        f"{len(run.requeues)} passes ({len(run.requeue_errors)} passes raised)",
        f"error types: {dict(report.error_types)}",
        f"worker log lines: {dict(report.log_counts)}",
        f"problems: {len(report.problems)}",
        *(f"  {p}" for p in report.problems[:25]),
    ]
    return "\n".join(lines)
