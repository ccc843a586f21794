"""The workflow benchmark's pure parts: shapes, latencies, targets, options, the table."""

from __future__ import annotations

import math

import pytest

from bench import workflow_tasks as wt
from bench.workflows import (
    WorkflowsConfig,
    chain_shape,
    chord_shape,
    config_of,
    fan_in_latencies,
    hop_latencies,
    meets,
    parse_args,
    same_host,
    table_of,
)


def test_chord_shape_is_children_then_one_callback_after_all_of_them() -> None:
    entries = chord_shape(4, n0=100).entries()
    assert [e[0].task for e in entries] == [wt.LEAF] * 4 + [wt.JOIN]
    assert [e[0].kwargs for e in entries[:4]] == [{"n": 100 + i} for i in range(4)]
    names = [e[1] for e in entries]
    assert names == [wt.LEAF, f"{wt.LEAF}#2", f"{wt.LEAF}#3", f"{wt.LEAF}#4", wt.JOIN]
    assert [e[2] for e in entries] == [(), (), (), (), (0, 1, 2, 3)]


def test_chain_shape_links_each_step_to_the_one_before() -> None:
    entries = chain_shape(3).entries()
    assert [e[1] for e in entries] == [wt.STEP, f"{wt.STEP}#2", f"{wt.STEP}#3"]
    assert [e[2] for e in entries] == [(), (0,), (1,)]


@pytest.mark.parametrize("shape", [lambda: chord_shape(0), lambda: chain_shape(1)])
def test_shapes_refuse_degenerate_sizes(shape: object) -> None:
    with pytest.raises(ValueError, match="needs at least"):
        shape()  # type: ignore[operator]


def test_hop_latencies_are_next_start_minus_previous_commit() -> None:
    starts = [10.0, 10.004, 10.010]
    commits = [10.001, 10.006, 10.012]
    assert hop_latencies(starts, commits) == pytest.approx([3.0, 4.0])


def test_hop_latencies_refuse_unpaired_lists() -> None:
    with pytest.raises(ValueError, match="2 starts for 3 commits"):
        hop_latencies([1.0, 2.0], [1.0, 2.0, 3.0])


def test_fan_in_latency_counts_from_the_last_child() -> None:
    chords = [(5.020, [4.990, 5.000, 5.010]), (7.5, [7.4])]
    assert fan_in_latencies(chords) == pytest.approx([10.0, 100.0])
    with pytest.raises(ValueError, match="without children"):
        fan_in_latencies([(1.0, [])])


@pytest.mark.parametrize(
    ("key", "value", "verdict"),
    [
        ("fanout_write_s", 0.9, "met"),
        ("fanout_write_s", 1.2, "NOT met"),
        ("chord_drain_ratio", 0.8, "met"),
        ("chord_drain_ratio", 0.79, "NOT met"),
        ("fan_in_p99_ms", math.nan, "not measured"),
    ],
)
def test_meets_reads_each_target_its_way(key: str, value: float, verdict: str) -> None:
    assert meets(key, value) == verdict


def test_options_make_the_config() -> None:
    config = config_of(parse_args(["--children", "500", "--peers", "pgboss", "--chain", "50"]))
    assert (config.children, config.chain, tuple(config.peers)) == (500, 50, ("pgboss",))
    assert config_of(parse_args(["--no-peers"])).peers == ()
    assert config_of(parse_args(["--peers", ""])).peers == ()
    assert config_of(parse_args([])) == WorkflowsConfig()


@pytest.mark.parametrize(
    ("url", "local"),
    [
        ("postgresql://postgres@127.0.0.1:5432/x", True),
        ("postgresql://postgres@localhost/x", True),
        ("postgresql+psycopg://u@db.example.com/x", False),
    ],
)
def test_same_host(url: str, local: bool) -> None:
    assert same_host(url) is local


def _figures() -> dict[str, object]:
    return {
        "fanout_total_s": 0.8,
        "fanout_write_s": 0.8,
        "fanout_build_s": 0.5,
        "fanout_enqueue_s": 0.3,
        "fanout_plain_s": 0.3,
        "plain_rate": 2000.0,
        "chord_rate": 1800.0,
        "chord_drain_ratio": 0.9,
        "plain_cpu_us": 200.0,
        "chord_cpu_us": 300.0,
        "fan_in_ms": [2.0, 3.0, 40.0],
        "fan_in_p50_ms": 3.0,
        "fan_in_p99_ms": 40.0,
        "chain_ms": [4.0, 6.0],
        "chain_hop_p50_ms": 4.0,
        "hot_plain_rate": 2500.0,
        "hot_chord_rate": 2000.0,
        "hot_ratio": 0.8,
        "peers": {
            "pgboss": {
                "fanout_write_s": 1.6,
                "chord_rate": 900.0,
                "fan_in_p50_ms": 1000.0,
                "notes": ["a note"],
            },
            "chancy": {"skipped": "chancy is not installed"},
        },
    }


def test_table_marks_targets_and_shows_peers_as_ratios_or_skips() -> None:
    table = table_of(_figures(), WorkflowsConfig(peers=("pgboss", "chancy")))
    text = table.render()
    assert "0.800" in text and "met" in text and "0.500 / 0.300" in text
    first = next(r for r in table.rows if r[0].startswith("1."))
    assert first[4:] == ["1.600 s", "skipped"]
    assert "Chancy workflows: skipped: chancy is not installed" in text
    assert "pg-boss 12 flow: a note" in text
    # sqla_queue's write is 2x faster, its drain 2x, its fan-in p50 1000 / 3 ms.
    assert "write 2.00x, chord drain 2.00x, fan-in p50 333x" in text
    assert table.markdown().startswith("**Workflows")
