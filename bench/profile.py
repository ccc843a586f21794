"""Where a sqla_queue drain spends its time: statements per job, and a py-spy profile.

    python -m bench.profile --system sqla-sync --batch 10 --jobs 20000
    python -m bench.profile --system sqla-async --py-spy idle

It drains like the drain scenario and reports, per job, the statements the worker sent by
kind (claim, complete, heartbeat, ...) and the average claim size. With ``--py-spy gil``
(needs ``pip install py-spy``) the first worker runs under py-spy sampling the thread that
holds the GIL, which shows the Python cost; ``--py-spy idle`` samples every thread, waits
included, which shows where the wall time goes. The raw profile is kept under ``--out``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from bench.common import BenchDatabase, resolve_server_url
from bench.drain import drain_once


def _frame_name(frame: str) -> str:
    # "func (path/to/file.py:123)" -> "func (file.py)"
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = Path(path).parts
    short = "/".join(parts[-2:]) if len(parts) >= 2 else path
    return f"{name} ({short})"


def _role(frames: list[str]) -> str:
    text = ";".join(frames)
    if "_serve (" in text:
        return "handler threads"
    if "Heartbeater" in text or "beat (" in text:
        return "heartbeater"
    if "Listener" in text or "notifies (" in text:
        return "listener"
    return "run loop"


def summarize_profile(lines: Iterable[str], top: int = 25, only_role: str | None = None) -> str:
    """Samples by thread role, then the top functions by inclusive and by own samples.

    ``lines`` are py-spy's raw output: one stack per line, root first, frames separated by
    ``;``, then the sample count.
    """
    total = 0
    roles: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for line in lines:
        stack, _, count_text = line.rstrip().rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if not f.startswith("thread (")]
        if not frames or any(f.startswith("_find_and_load (") for f in frames):
            continue  # imports happen before the start barrier: not part of the drain
        role = _role(frames)
        roles[role] += count
        if only_role is not None and role != only_role:
            continue
        total += count
        names = [_frame_name(f) for f in frames]
        for name in set(names):
            inclusive[name] += count
        own[names[-1]] += count
    everything = sum(roles.values())
    out = [f"{everything} samples"]
    out += [f"  {n / everything:6.1%}  {role}" for role, n in roles.most_common()]
    scope = f"the {only_role}'s" if only_role else "all"
    out.append(f"\nTop {top} functions, inclusive (share of {scope} samples):")
    out += [f"  {n / total:6.1%}  {name}" for name, n in inclusive.most_common(top)]
    out.append(f"\nTop {top} functions, own time:")
    out += [f"  {n / total:6.1%}  {name}" for name, n in own.most_common(top)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Run one profiled drain and print what it shows."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="PostgreSQL server to use")
    parser.add_argument(
        "--system", default="sqla-sync", choices=("sqla-sync", "sqla-async", "pgqueuer", "bare")
    )
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--task", help="task to drain (default: the no-op), e.g. bench.limit5000")
    parser.add_argument("--py-spy", choices=("none", "gil", "idle"), default="none")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--out", type=Path, default=Path("bench-profile"))
    parser.add_argument(
        "--pgoptions", help="PGOPTIONS for the workers, e.g. '-c synchronous_commit=off'"
    )
    args = parser.parse_args(argv)

    prefixes: list[list[str]] = []
    raw = args.out / f"{args.system}-W{args.workers}-b{args.batch}-{args.py_spy}.txt"
    if args.py_spy != "none":
        # A venv's scripts need not be on PATH: look beside the interpreter too.
        spy = shutil.which("py-spy") or shutil.which(
            "py-spy", path=str(Path(sys.executable).parent)
        )
        if spy is None:
            print("py-spy is not installed: pip install py-spy", file=sys.stderr)
            return 2
        args.out.mkdir(parents=True, exist_ok=True)
        mode = "--gil" if args.py_spy == "gil" else "--idle"
        spy_args = ["record", "--format", "raw", "--threads", mode, "--rate", str(args.rate)]
        prefixes = [[spy, *spy_args, "--output", str(raw), "--"]]
    with BenchDatabase(resolve_server_url(args.url)) as db:
        run = drain_once(
            db,
            args.system,
            args.workers,
            args.batch,
            args.jobs,
            task=args.task,
            extra_args=["--trace-statements"],
            prefixes=prefixes,
            env={"PGOPTIONS": args.pgoptions} if args.pgoptions else None,
        )
    statements: Counter[str] = Counter()
    claimed = 0
    for report in run.reports:
        statements.update(report.get("statements", {}))
        claimed += int(report.get("claimed", 0))
    print(
        f"{args.system}: {args.jobs:,} jobs, {args.workers} worker(s), batch {args.batch}: "
        f"{run.rate(args.jobs):,.0f} jobs/s ({run.seconds:.2f}s), "
        f"worker CPU {run.cpu_us_per_job(args.jobs):.0f} us/job, "
        f"server CPU {run.server_us_per_job(args.jobs):.0f} us/job"
    )
    print(
        "statements per job: "
        + ", ".join(f"{kind} {n / args.jobs:.3f}" for kind, n in statements.most_common())
    )
    claims = statements.get("claim", 0)
    completes = statements.get("complete", 0)
    if claims:
        print(
            f"average claim: {claimed / claims:.2f} jobs (batch {args.batch}); "
            f"average completion: {args.jobs / max(completes, 1):.2f} jobs"
        )
    if args.py_spy != "none" and raw.exists():
        print(f"\npy-spy ({args.py_spy}) of worker 1, raw stacks in {raw}:")
        # Idle samples of parked handler threads would drown everything: show the run loop.
        role = "run loop" if args.py_spy == "idle" else None
        print(summarize_profile(raw.read_text().splitlines(), only_role=role))
    return 0


if __name__ == "__main__":
    sys.exit(main())
