"""Run the benchmark suite and print the side-by-side tables.

    python -m bench.run --quick                 # a few minutes: the headline cases
    python -m bench.run                         # everything (tens of minutes)
    python -m bench.run --scenarios drain --jobs 200000 --json drain.json

It creates a scratch database ``sqlaq_bench_<pid>_<hex>`` on the server of ``--url`` (else
``$SQLA_QUEUE_TEST_URL``, else 127.0.0.1:5432, else an embedded server), installs
sqla_queue's, PgQueuer's and the bare baseline's tables in it, and drops it at the end.
No other database is touched.

The drain also runs graphile-worker and pg-boss (Node) when ``npm`` can install
``bench/node`` (see bench/node_peers.py); ``--no-node`` leaves them out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.backlog import BacklogConfig, LimitConfig, run_backlog, run_limits
from bench.common import BenchDatabase, TextTable, load_average, machine_info, resolve_server_url
from bench.drain import LABELS, NODE_SYSTEMS, DrainConfig, run_drain
from bench.enqueue import EnqueueConfig, run_enqueue
from bench.latency import LatencyConfig, run_latency
from bench.sustained import SustainedConfig, run_sustained

SCENARIOS = ("drain", "enqueue", "latency", "backlog", "limits", "sustained")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.run",
        description="sqla_queue vs PgQueuer vs bare SQL, side by side on one server.",
    )
    parser.add_argument("--url", help="PostgreSQL server to use (any database on it)")
    parser.add_argument("--quick", action="store_true", help="the headline cases only")
    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help=f"comma-separated subset of {','.join(SCENARIOS)} (memory comes with drain)",
    )
    parser.add_argument("--jobs", type=int, help="jobs per drain (default 20000, quick 10000)")
    parser.add_argument("--workers", help="worker processes per drain, e.g. 1,2,4")
    parser.add_argument("--batches", help="batch/concurrency values, e.g. 10,100")
    parser.add_argument("--repeat", type=int, help="repeats of each short run (default 3)")
    parser.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    parser.add_argument("--markdown", type=Path, help="also write the tables as Markdown")
    parser.add_argument(
        "--protocol",
        choices=("cold", "warm", "both"),
        default="both",
        help="cold (statistics of the empty tables, the default) and/or warm (ANALYZE after "
        "the enqueue); both: cold first, warm beside it",
    )
    parser.add_argument(
        "--big",
        action="store_true",
        help="backlog: 10,000,000 rows of history instead of 1,000,000 (minutes, GBs)",
    )
    parser.add_argument(
        "--systems", help="drain: comma-separated systems (default: every one installed)"
    )
    parser.add_argument("--cases", help="drain: comma-separated cases of plain,burst,hot")
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    parser.add_argument(
        "--no-node",
        action="store_true",
        help="leave the Node peers (graphile-worker, pg-boss) out of the drain; without npm "
        "they are left out anyway",
    )
    return parser.parse_args(argv)


def _ints(text: str | None, default: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",")) if text else default


def configs(args: argparse.Namespace) -> dict[str, Any]:
    """The configuration of every scenario, from ``--quick`` and the overrides."""
    quick = args.quick
    repeat = args.repeat or 3
    protocols = ("cold", "warm") if args.protocol == "both" else (args.protocol,)
    big = 100_000 if quick else 1_000_000
    return {
        "drain": DrainConfig(
            jobs=args.jobs or (10_000 if quick else 20_000),
            workers=_ints(args.workers, (2,) if quick else (1, 2, 4)),
            batches=_ints(args.batches, (10, 100)),
            repeat=args.repeat or (1 if quick else 3),
            protocols=protocols,
            cap_s=45.0 if quick else 120.0,
            **({"systems": tuple(args.systems.split(","))} if args.systems else {}),
            **({"cases": tuple(args.cases.split(","))} if args.cases else {}),
        ),
        "enqueue": EnqueueConfig(
            transactions=500 if quick else 2_000,
            producers=(1,) if quick else (1, 4),
            bulk=100_000,
            repeat=repeat,
        ),
        "latency": LatencyConfig(jobs=500 if quick else 2_000),
        "backlog": BacklogConfig(
            big=big,
            history=10_000_000 if args.big else big,
            claims=20 if quick else 50,
            budget_s=10.0 if quick else 20.0,
            protocols=protocols,
        ),
        "limits": LimitConfig(
            jobs=5_000 if quick else 20_000,
            repeat=1 if quick else repeat,
            protocol=protocols[0],
        ),
        "sustained": SustainedConfig(seconds=15.0 if quick else 60.0),
    }


def with_node_peers(config: DrainConfig, wanted: bool) -> DrainConfig:
    """``config`` without the Node systems unless they are ``wanted`` and npm installs them."""
    from bench import node_peers

    reason = "--no-node"
    if wanted:
        try:
            node_peers.ensure_installed()
            return config
        except node_peers.NodePeersUnavailable as error:
            reason = str(error)
    print(f"drain: without the Node peers, graphile-worker and pg-boss ({reason})", flush=True)
    return dataclasses.replace(
        config, systems=tuple(s for s in config.systems if s not in NODE_SYSTEMS)
    )


#: (sqla_queue drain system, its sync twin or None): the rows the drain targets check.
DRAIN_TARGETS = (
    ("sqla-sync", None),
    ("sqla-async", "sqla-sync"),
    ("sqla-sync-prefetch", None),
    ("sqla-async-prefetch", "sqla-sync-prefetch"),
)


def _drain_targets(add: Callable[[str, float, bool, str], None], dsum: Any, protocol: str) -> None:
    """Issue 28's drain targets at 2 workers and batch 10, from per-round ratios."""
    tag = f"[{protocol}]"

    def cell(case: str, system: str) -> dict[str, Any]:
        found: dict[str, Any] = dsum.get(f"{protocol}/{case}/{system}/W2/b10", {})
        return found

    batched = cell("plain", "graphile-batched")
    for system, sync in DRAIN_TARGETS:
        plain = cell("plain", system)
        if not plain:
            continue
        label = LABELS[system]
        vs = plain.get("rounds_vs", {})
        for other, name, aim in (
            ("graphile-batched", "graphile-worker batched", 1.2),
            ("pgqueuer", "PgQueuer", 1.5),
            ("bare", "bare SQL", 0.9),
        ):
            value = vs.get(other, math.nan)
            shown = f"{value:.2f}x"
            add(f"{tag} plain drain, {label} >= {aim}x {name}", value, value >= aim, shown)
        if batched:
            mine, theirs = plain["total_cpu_us_per_job"], batched["total_cpu_us_per_job"]
            add(
                f"{tag} {label}: worker + server CPU/job <= graphile-worker batched's",
                mine,
                mine <= theirs,
                f"{mine:.0f} vs {theirs:.0f} us",
            )
        if sync is not None:
            value = vs.get(sync, math.nan)
            add(f"{tag} {label} >= 0.95x sync", value, value >= 0.95, f"{value:.2f}x")
            twin = cell("plain", sync)
            if twin:
                cpu = plain["total_cpu_us_per_job"] / twin["total_cpu_us_per_job"]
                add(f"{tag} {label}: CPU/job <= 1.1x sync", cpu, cpu <= 1.1, f"{cpu:.2f}x")
        for case, name in (("burst", "first 10% of a burst"), ("hot", "behind a hot key")):
            value = cell(case, system).get("vs_plain", math.nan)
            add(f"{tag} {label}, {name} >= 0.85x plain", value, value >= 0.85, f"{value:.2f}x")
    nohistory = cell("plain", "sqla-sync-nohistory").get("rounds_vs", {})
    value = nohistory.get("graphile-batched", math.nan)
    add(
        f"{tag} plain drain, no history >= 1.5x graphile-worker batched",
        value,
        value >= 1.5,
        f"{value:.2f}x",
    )


def targets(results: dict[str, Any]) -> TextTable:
    """This run's headline ratios beside the levels the project aims for."""
    table = TextTable("Headline ratios against their aims", ["aim", "measured", "reached"])

    def add(name: str, value: float, ok: bool, shown: str) -> None:
        verdict = "-" if math.isnan(value) else ("yes" if ok else "no")
        table.add(name, shown if not math.isnan(value) else "not measured", verdict)

    drain = results.get("drain", {})
    dsum = drain.get("summary", {})
    for protocol in drain.get("protocols", []):
        _drain_targets(add, dsum, protocol)
    enq = results.get("enqueue", {}).get("summary", {})
    sq = enq.get("bulk/sqla", {}).get("median", math.nan)
    pq = enq.get("bulk/pgqueuer", {}).get("median", math.nan)
    cp = enq.get("bulk/copy", {}).get("median", math.nan)
    add("bulk enqueue >= 1.2x PgQueuer", sq / pq, sq / pq >= 1.2, f"{sq / pq:.2f}x")
    st = enq.get("bulk/sqla-stmt", {}).get("median", math.nan)
    add("bulk enqueue (COPY) >= 2x the statement", sq / st, sq / st >= 2, f"{sq / st:.2f}x")
    add("bulk enqueue >= 0.5x COPY", sq / cp, sq / cp >= 0.5, f"{sq / cp:.2f}x")
    same = [
        (run_sqla - run_host) / (run_bare - run_host)
        for run_sqla, run_bare, run_host in zip(
            enq.get("same_client/sqla", {}).get("wall_ms", []),
            enq.get("same_client/bare", {}).get("wall_ms", []),
            enq.get("same_client/host", {}).get("wall_ms", []),
            strict=True,
        )
    ]
    added = statistics.median(same) if same else math.nan
    add(
        "enqueue added to a business transaction <= 1.25x bare SQL (one client stack)",
        added,
        added <= 1.25,
        f"{added:.2f}x",
    )
    lat = results.get("latency", {}).get("summary", {}).get("sqla-notify", {})
    p50 = lat.get("p50", math.nan)
    p99 = lat.get("p99", math.nan)
    add("NOTIFY latency p50 <= 5 ms (sync worker)", p50, p50 <= 5, f"{p50:.1f} ms")
    add("NOTIFY latency p99 <= 25 ms (sync worker)", p99, p99 <= 25, f"{p99:.1f} ms")
    backlog = results.get("backlog", {})
    shapes = backlog.get("summary", {})
    for protocol in backlog.get("protocols", []):
        for name, entry in shapes.items():
            if not entry.get("large"):
                continue
            value = entry.get(protocol, {}).get("vs_first", math.nan)
            add(
                f"[{protocol}] claim at {name} <= 2x claim at {backlog['first']}",
                value,
                value <= 2,
                f"{value:.2f}x",
            )
    limited = results.get("limits", {}).get("summary", {}).get("5000", {})
    paired = limited.get("paired_vs_unlimited", [])
    value = statistics.median(paired) if paired else math.nan
    add("drain of a task limited to 5000 >= 0.85x unlimited", value, value >= 0.85, f"{value:.2f}x")
    for target in results.get("sustained", {}).get("targets", []):
        met = target["met"]
        value = math.nan if met is None else float(target["value"])
        add(f"sustained: {target['target']}", value, bool(met), f"{value:.1f}")
    if backlog:
        scans = backlog.get("seq_scans", [])
        add("[cold] no seq scan in the claim plans", 0.0, not scans, "; ".join(scans) or "none")
    for system, label in (("sqla-sync", "sync"), ("sqla-async", "async")):
        peaks = [
            max(r["rss_mb"])
            for r in results.get("drain", {}).get("runs", [])
            if r["system"] == system and r["batch"] == 100
        ]
        peak = max(peaks) if peaks else math.nan
        add(f"{label} worker RSS < 150 MB at concurrency 100", peak, peak < 150, f"{peak:.0f} MB")
    return table


def main(argv: list[str] | None = None) -> int:
    """Run the chosen scenarios; print every table; write JSON/Markdown if asked."""
    args = parse_args(argv)
    chosen = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = set(chosen) - set(SCENARIOS)
    if unknown:
        print(f"unknown scenarios: {sorted(unknown)}; choose from {SCENARIOS}", file=sys.stderr)
        return 2
    cfg = configs(args)
    if "drain" in chosen:
        cfg["drain"] = with_node_peers(cfg["drain"], not args.no_node)
    server = resolve_server_url(args.url)
    started = time.monotonic()
    results: dict[str, Any] = {}
    tables: list[TextTable] = []
    with BenchDatabase(server, keep=args.keep) as db:
        info = machine_info(db)
        print(_header(info, db.name), flush=True)
        runners: dict[str, Callable[..., dict[str, Any]]] = {
            "drain": run_drain,
            "enqueue": run_enqueue,
            "latency": run_latency,
            "backlog": run_backlog,
            "limits": run_limits,
            "sustained": run_sustained,
        }
        for name in chosen:
            print(f"\n[{name}] load average {_load()}", flush=True)
            result = runners[name](db, cfg[name], log=lambda line: print(line, flush=True))
            results[name] = result
            tables.extend(result["tables"])
            for table in result["tables"]:
                print("\n" + table.render(), flush=True)
            if name == "backlog":
                for shape, plan in result["plans"].items():
                    print(
                        f"\nEXPLAIN (ANALYZE, BUFFERS) of the claim, cold protocol, {shape} "
                        "(generic plan, planner guard):"
                    )
                    print("\n".join(plan))
    goal = targets(results)
    tables.append(goal)
    info["load_at_end"] = load_average()
    info["minutes"] = round((time.monotonic() - started) / 60, 1)
    print("\n" + goal.render())
    print(
        f"\nload average at start {info['load_at_start']}, at end {_load()}; "
        f"{info['minutes']} minutes"
    )
    if args.json:
        payload = {
            "machine": info,
            "arguments": sys.argv[1:] if argv is None else argv,
            "results": {k: _jsonable(v) for k, v in results.items()},
        }
        args.json.write_text(json.dumps(payload, indent=2, default=str))
    if args.markdown:
        args.markdown.write_text("\n\n".join(t.markdown() for t in tables) + "\n")
    return 0


def _jsonable(result: dict[str, Any]) -> dict[str, Any]:
    return {k: ([t.as_json() for t in v] if k == "tables" else v) for k, v in result.items()}


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in load_average())


def _header(info: dict[str, Any], dbname: str) -> str:
    settings = info["settings"]
    return (
        f"sqla_queue {info['sqla_queue']} | PgQueuer {info['pgqueuer']} | "
        f"SQLAlchemy {info['sqlalchemy']} | psycopg {info['psycopg']} | "
        f"Python {info['python']}\n"
        f"{info['nproc']} CPUs ({info['cpu']}), {info['memory_gib']} GiB | "
        f"PostgreSQL {info['postgresql']} fsync={settings['fsync']} "
        f"synchronous_commit={settings['synchronous_commit']} "
        f"shared_buffers={settings['shared_buffers']} | scratch database {dbname}\n"
        f"load average {_load()}"
    )


if __name__ == "__main__":
    sys.exit(main())
