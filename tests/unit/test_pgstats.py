"""What a benchmark run's PostgreSQL did: the difference of two snapshots."""

from __future__ import annotations

from chronoq.bench.pgstats import TOP_STATEMENTS, Snapshot, Statement, between


def test_between_counts_what_ran_and_orders_statements_by_time() -> None:
    before = Snapshot(
        dead=1200,
        autovacuums=3,
        autoanalyzes=2,
        checkpoints=7,
        statements={1: Statement("fire", 10, 50.0, 100), 2: Statement("claim", 5, 5.0, 5)},
    )
    after = Snapshot(
        dead=40,
        autovacuums=4,
        autoanalyzes=2,
        checkpoints=9,
        statements={
            1: Statement("fire", 110, 150.0, 1100),  # 100 calls, 100 ms
            2: Statement("claim", 5, 5.0, 5),  # did not run: left out
            3: Statement("complete", 40, 400.0, 400),  # new: all of it counts
        },
    )
    run = between(before, after)
    assert (run.dead_at_start, run.autovacuums, run.autoanalyzes, run.checkpoints) == (
        1200,
        1,
        0,
        2,
    )
    assert [(s.query, s.calls, s.total_ms, s.rows) for s in run.statements] == [
        ("complete", 40, 400.0, 400),
        ("fire", 100, 100.0, 1000),
    ]
    assert run.statements[1].mean_ms == 1.0
    assert "autovacuum 1" in run.line() and "dead rows at start 1,200" in run.line()
    assert len(run.top()) == 2


def test_between_keeps_the_costliest_few() -> None:
    after = Snapshot(statements={i: Statement(f"q{i}", 1, float(i), 1) for i in range(20)})
    run = between(Snapshot(), after)
    assert [s.query for s in run.statements] == [f"q{i}" for i in range(19, 19 - TOP_STATEMENTS, -1)]


def test_planning_counts_toward_a_statements_cost() -> None:
    after = Snapshot(statements={
        1: Statement("executes long", 10, 30.0, 10),
        2: Statement("plans long", 10, 10.0, 10, plan_ms=25.0),
    })
    run = between(Snapshot(), after)
    assert [s.query for s in run.statements] == ["plans long", "executes long"]
    assert "(+ 2.50 planning)" in run.top()[0]
