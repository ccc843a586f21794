"""Before/after: one library revision against the working tree, rounds interleaved.

    python -m bench.ab HEAD~3                  # 3 rounds: drain and single enqueue
    python -m bench.ab v0.1.0 --rounds 5 --jobs 20000

A refactor must not cost speed, and this machine is too noisy to compare runs made at
different times. Each round runs the same measurement once for the revision and once for
the working tree, in alternating order, each in a process of its own that imports its
own ``sqla_queue``: the revision's ``sqla_queue`` and ``alembic_ext`` are exported with
``git archive`` into a scratch folder beside a copy of this ``bench`` package, so both sides
run the same benchmark code. A measurement is:

* the plain drain (cold protocol: statistics of the empty tables, no ANALYZE before the
  clock) of ``--jobs`` no-op jobs by 2 worker processes at batch 10, sync and async;
* the time (and client CPU) one ``task.enqueue`` adds to an ORM business transaction,
  beside the same transaction without a job on the same client stack
  (``bench.enqueue.same_client_cost``): medians, and the 50th and 99th percentiles of
  the whole transaction with its enqueue (and the 99th without one).

Worker CPU per job (and the server backends' CPU per job) is the steadier figure on a
shared machine: rates swing with the load of other tenants, the CPU spent on a job much
less.

It prints each round's figures, then the medians and the after/before ratios.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from bench.common import ROOT

#: The figures of one measurement, and whether larger is better.
FIGURES = {
    "drain sync (jobs/s)": True,
    "drain async (jobs/s)": True,
    "sync worker CPU (us/job)": False,
    "async worker CPU (us/job)": False,
    "sync server CPU (us/job)": False,
    "async server CPU (us/job)": False,
    "enqueue added (ms)": False,
    "enqueue client CPU (ms)": False,
    "enqueue txn p50 (ms)": False,
    "enqueue txn p99 (ms)": False,
    "host txn p99 (ms)": False,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__)
    parser.add_argument("revision", nargs="?", help="git revision to compare the tree with")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per drain")
    parser.add_argument("--transactions", type=int, default=2_000, help="per enqueue kind")
    parser.add_argument("--url", help="PostgreSQL server to use (any database on it)")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.measure and not args.revision:
        parser.error("name the git revision to compare with")
    return args


def measure(args: argparse.Namespace) -> dict[str, float]:
    """One measurement with whatever ``sqla_queue`` this process imports."""
    from bench.common import BenchDatabase, percentile, resolve_server_url
    from bench.drain import DrainConfig, run_drain
    from bench.enqueue import same_client_cost

    config = DrainConfig(
        jobs=args.jobs,
        workers=(2,),
        batches=(10,),
        systems=("sqla-sync", "sqla-async"),
        repeat=1,
        protocols=("cold",),
        cases=("plain",),
    )
    with BenchDatabase(resolve_server_url(args.url)) as db:
        drain = run_drain(db, config, log=lambda line: print(line, file=sys.stderr))
        walls: dict[str, list[float]] = {}
        cost = same_client_cost(db, args.transactions, walls)
    summary = drain["summary"]
    sync, aio = summary["cold/plain/sqla-sync/W2/b10"], summary["cold/plain/sqla-async/W2/b10"]
    return {
        "drain sync (jobs/s)": sync["median"],
        "drain async (jobs/s)": aio["median"],
        "sync worker CPU (us/job)": sync["cpu_us_per_job"],
        "async worker CPU (us/job)": aio["cpu_us_per_job"],
        # The database backends' CPU per job: the statements' own cost, beside the client's.
        "sync server CPU (us/job)": sync["server_us_per_job"],
        "async server CPU (us/job)": aio["server_us_per_job"],
        "enqueue added (ms)": 1000 * (cost["sqla"][0] - cost["host"][0]),
        "enqueue client CPU (ms)": 1000 * (cost["sqla"][1] - cost["host"][1]),
        # The whole business transaction with its enqueue, and the same one without.
        "enqueue txn p50 (ms)": 1000 * percentile(walls["sqla"], 50),
        "enqueue txn p99 (ms)": 1000 * percentile(walls["sqla"], 99),
        "host txn p99 (ms)": 1000 * percentile(walls["host"], 99),
    }


def export(revision: str, into: Path) -> Path:
    """A folder with ``revision``'s library and this tree's ``bench`` package."""
    archive = into / "lib.tar"
    with archive.open("wb") as out:
        subprocess.run(
            ["git", "archive", "--format=tar", revision, "sqla_queue", "alembic_ext"],
            cwd=ROOT,
            stdout=out,
            check=True,
        )
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    archive.unlink()
    shutil.copytree(ROOT / "bench", into / "bench", ignore=shutil.ignore_patterns("results"))
    return into


def run_side(folder: Path, args: argparse.Namespace) -> dict[str, float]:
    """One measurement in a process whose ``sqla_queue`` is the one in ``folder``."""
    command = [sys.executable, "-m", "bench.ab", "--measure", "--jobs", str(args.jobs)]
    command += ["--transactions", str(args.transactions)]
    if args.url:
        command += ["--url", args.url]
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"measurement in {folder} failed:\n{done.stderr[-4000:]}")
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def main(argv: list[str] | None = None) -> int:
    """Measure, or compare a revision with the tree."""
    args = parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args)))
        return 0
    results: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="sqlaq-ab-") as scratch:
        sides = {"before": export(args.revision, Path(scratch)), "after": ROOT}
        for round_no in range(args.rounds):
            # Alternate who goes first, so a drift in the machine's load favours neither.
            order = ["before", "after"] if round_no % 2 == 0 else ["after", "before"]
            for side in order:
                figures = run_side(sides[side], args)
                results[side].append(figures)
                shown = ", ".join(f"{k} {v:,.3f}" for k, v in figures.items())
                print(f"round {round_no + 1} {side:<6}: {shown}", flush=True)
    print(f"\nmedian of {args.rounds} rounds: {args.revision} (before) vs the working tree")
    for name, larger_is_better in FIGURES.items():
        before = statistics.median(r[name] for r in results["before"])
        after = statistics.median(r[name] for r in results["after"])
        better = "higher is better" if larger_is_better else "lower is better"
        print(
            f"  {name:<26} before {before:>10,.3f}  after {after:>10,.3f}  "
            f"after/before {after / before:.3f} ({better})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
