"""Run the benchmark suite and print the side-by-side tables.

    python -m bench.run --quick                 # a few minutes: the headline cases
    python -m bench.run                         # everything (tens of minutes)
    python -m bench.run --scenarios drain --jobs 200000 --json drain.json

It creates a scratch database ``sqlaq_bench_<pid>_<hex>`` on the server of ``--url`` (else
``$SQLA_QUEUE_TEST_URL``, else 127.0.0.1:5432, else an embedded server), installs
sqla_queue's, PgQueuer's and the bare baseline's tables in it, and drops it at the end.
No other database is touched.
"""

from __future__ import annotations

import argparse
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
from bench.drain import DrainConfig, run_drain
from bench.enqueue import EnqueueConfig, run_enqueue
from bench.latency import LatencyConfig, run_latency

SCENARIOS = ("drain", "enqueue", "latency", "backlog", "limits")


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
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
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
    }


def targets(results: dict[str, Any]) -> TextTable:
    """This run's headline ratios beside the levels the project aims for."""
    table = TextTable("Headline ratios against their aims", ["aim", "measured", "reached"])

    def add(name: str, value: float, ok: bool, shown: str) -> None:
        verdict = "-" if math.isnan(value) else ("yes" if ok else "no")
        table.add(name, shown if not math.isnan(value) else "not measured", verdict)

    drain = results.get("drain", {})
    dsum = drain.get("summary", {})
    for protocol in drain.get("protocols", []):
        tag = f"[{protocol}]"
        for system, label in (("sqla-sync", "sync"), ("sqla-async", "async")):
            a = dsum.get(f"{protocol}/plain/{system}/W2/b10", {})
            b = dsum.get(f"{protocol}/burst/{system}/W2/b10", {})
            c = dsum.get(f"{protocol}/hot/{system}/W2/b10", {})
            for case, name in ((a, "plain drain"), (b, "first-of-burst drain")):
                peer = case.get("vs_pgqueuer", math.nan)
                add(f"{tag} {name} {label} >= 1.5x PgQueuer", peer, peer >= 1.5, f"{peer:.2f}x")
            bare = a.get("vs_bare", math.nan)
            add(f"{tag} plain drain {label} >= 0.75x bare SQL", bare, bare >= 0.75, f"{bare:.2f}x")
            pair = b.get("vs_plain", math.nan)
            add(f"{tag} first-of-burst {label} >= 0.8x plain", pair, pair >= 0.8, f"{pair:.2f}x")
            hot = c.get("vs_plain", math.nan)
            add(f"{tag} hot-key drain {label} >= 0.8x plain", hot, hot >= 0.8, f"{hot:.2f}x")
    enq = results.get("enqueue", {}).get("summary", {})
    sq = enq.get("bulk/sqla", {}).get("median", math.nan)
    pq = enq.get("bulk/pgqueuer", {}).get("median", math.nan)
    cp = enq.get("bulk/copy", {}).get("median", math.nan)
    add("bulk enqueue >= 1.2x PgQueuer", sq / pq, sq / pq >= 1.2, f"{sq / pq:.2f}x")
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
