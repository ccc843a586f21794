"""Side-by-side benchmarks of sqla_queue, PgQueuer and a bare-SQL baseline.

Run ``python -m bench.run --quick`` from the repository root; see ``bench/README.md``.
"""
