"""Run the curated mutants (``nox -s mutants``, or ``python -m tests.mutants``).

Usage: ``python -m tests.mutants [--list] [--check] [--no-baseline] [NAME ...]``.

1. Every mutant's ``old`` text must occur exactly once in its file, or the run fails before
   anything else (a mutant whose text is gone, or ambiguous, would prove nothing).
2. The working tree is copied to a temporary directory (``.git``, virtualenvs and caches
   left out); the working tree itself is never written.
3. Baseline: the guarding tests of the selected mutants run once on the unchanged copy and
   must pass, so that a failure under a mutant is the mutant's doing.
4. Each mutant in turn: its change is written into the copy, its guarding tests run there
   (``pytest -x``, the copy first on ``sys.path`` and ``PYTHONPATH``), the file is put back.
   The mutant is caught when pytest reports failed tests (exit code 1) or runs out of time;
   it survived when they pass; any other outcome (no tests collected, a usage error) fails
   the run as an error, since it proves nothing either way.

Every connection of the test runs gets ``lock_timeout`` (``PGOPTIONS``), so that a mutant
that makes a statement wait forever (no SKIP LOCKED) fails its test instead of hanging it.
The exit status is non-zero unless every selected mutant was caught.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from tests.mutants.catalog import MUTANTS, Mutant

ROOT = Path(__file__).resolve().parents[2]
#: Left out of the scratch copy: history, environments, caches and build output.
IGNORED = shutil.ignore_patterns(
    ".git",
    ".nox",
    ".ci-venv",
    ".venv",
    "venv",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    "*.egg-info",
    "node_modules",
    "site",
    "dist",
    "build",
)
#: Seconds a mutant's tests may take before the mutant counts as caught (they hung).
TIMEOUT = 300.0
#: Seconds the baseline may take.
BASELINE_TIMEOUT = 900.0
#: Seconds any statement of the test runs may wait for a lock.
LOCK_TIMEOUT = "20s"


def check_texts(mutants: Sequence[Mutant], root: Path) -> list[str]:
    """Why some mutants cannot be applied: their file is missing, or their ``old`` text
    does not occur exactly once in it. Empty when all can."""
    problems: list[str] = []
    names = [m.name for m in MUTANTS]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"{name}: the name is used by more than one mutant")
    for mutant in mutants:
        path = root / mutant.path
        if not path.is_file():
            problems.append(f"{mutant.name}: {mutant.path} does not exist")
            continue
        count = path.read_text(encoding="utf-8").count(mutant.old)
        if count != 1:
            problems.append(
                f"{mutant.name}: its old text occurs {count} times in {mutant.path} "
                "(it must occur exactly once: rewrite the mutant against the file as it is)"
            )
        if mutant.old == mutant.new:
            problems.append(f"{mutant.name}: its new text is its old text")
        if not mutant.tests:
            problems.append(f"{mutant.name}: it names no test")
    return problems


def run_tests(copy: Path, tests: Sequence[str], timeout: float) -> tuple[int | None, str]:
    """Run ``tests`` in ``copy``; ``(pytest's exit code or None on timeout, its output)``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(copy), env.get("PYTHONPATH")]))
    options = [env.get("PGOPTIONS"), f"-c lock_timeout={LOCK_TIMEOUT}"]
    env["PGOPTIONS"] = " ".join(filter(None, options))
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-x",
        "-n0",
        "-p",
        "no:cacheprovider",
        "--no-header",
        "-o",
        "addopts=-ra --strict-markers",
        *tests,
    ]
    # A session of its own, so that a run out of time can be ended with every process it
    # started (worker processes of the tests included).
    process = subprocess.Popen(
        command,
        cwd=copy,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        return None, output
    return process.returncode, output


def write_source(path: Path, text: str) -> None:
    """Write a module's source, and drop its cached bytecode: a cache written from the other
    text within the same second, at the same size, would otherwise still be taken."""
    path.write_text(text, encoding="utf-8")
    for cached in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        cached.unlink()


def tail(output: str, lines: int = 25) -> str:
    return "\n".join("    " + line for line in output.rstrip().splitlines()[-lines:])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutants", description=__doc__)
    parser.add_argument("names", nargs="*", help="run only these mutants (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--check", action="store_true", help="only check the old texts")
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the run of the unchanged copy"
    )
    args = parser.parse_args(argv)

    by_name = {m.name: m for m in MUTANTS}
    unknown = [n for n in args.names if n not in by_name]
    if unknown:
        parser.error(f"no such mutant: {', '.join(unknown)} (see --list)")
    selected = [by_name[n] for n in args.names] if args.names else list(MUTANTS)
    if args.list:
        for mutant in selected:
            print(f"{mutant.name:28} {mutant.path}\n{'':28} {mutant.promise}")
            for test in mutant.tests:
                print(f"{'':28}   {test}")
        return 0

    problems = check_texts(MUTANTS, ROOT)
    if problems:
        print("Stale or broken mutants (nothing was run):", *problems, sep="\n  ")
        return 1
    print(f"{len(MUTANTS)} mutants: every old text occurs exactly once.")
    if args.check:
        return 0

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sqla_queue_mutants_") as scratch:
        copy = Path(scratch) / "repo"
        shutil.copytree(ROOT, copy, ignore=IGNORED, symlinks=True)
        print(f"scratch copy: {copy}")

        if not args.no_baseline:
            tests = list(dict.fromkeys(t for m in selected for t in m.tests))
            began = time.monotonic()
            code, output = run_tests(copy, tests, BASELINE_TIMEOUT)
            print(f"baseline: {len(tests)} tests, exit {code} ({time.monotonic() - began:.0f}s)")
            if code != 0:
                print("The guarding tests fail on the unchanged code; fix that first:")
                print(tail(output))
                return 1

        results: list[tuple[Mutant, str, float]] = []
        for mutant in selected:
            path = copy / mutant.path
            original = path.read_text(encoding="utf-8")
            write_source(path, original.replace(mutant.old, mutant.new, 1))
            began = time.monotonic()
            try:
                code, output = run_tests(copy, mutant.tests, TIMEOUT)
            finally:
                write_source(path, original)
            took = time.monotonic() - began
            if code == 1:
                verdict = "caught"
            elif code is None:
                verdict = "caught (timed out)"
            elif code == 0:
                verdict = "SURVIVED"
            else:
                verdict = f"ERROR (pytest exit {code})"
            results.append((mutant, verdict, took))
            print(f"{verdict:20} {mutant.name:28} {took:5.0f}s")
            if not verdict.startswith("caught"):
                print(tail(output))

    print(f"\n{'mutant':28} {'verdict':20} guarding tests")
    for mutant, verdict, _ in results:
        print(f"{mutant.name:28} {verdict:20} {mutant.tests[0]}")
        for test in mutant.tests[1:]:
            print(f"{'':49} {test}")
    bad = [m.name for m, verdict, _ in results if not verdict.startswith("caught")]
    took = time.monotonic() - started
    print(f"\n{len(results) - len(bad)} of {len(results)} mutants caught in {took:.0f}s.")
    if bad:
        print(f"Not caught: {', '.join(bad)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
