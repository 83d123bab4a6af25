"""The shard map: partition lists, moves, the rebalance planner and the etcd form."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronoq.errors import InvalidArgument
from chronoq.shardmap import (
    MAX_MAP_BYTES,
    MAX_PARTITION_SPEC,
    Move,
    ShardMap,
    ShardMapConflict,
    ShardMapInvalid,
    format_partitions,
    parse_partitions,
    shard_name,
    shard_number,
    single,
)


@st.composite
def maps(draw: st.DrawFn, max_partitions: int = 300, max_shards: int = 9) -> ShardMap:
    """Any valid map: 1..max_partitions partitions over 1..max_shards registered shards (some
    possibly empty), at any version."""
    partitions = draw(st.integers(1, max_partitions))
    count = draw(st.integers(1, max_shards))
    shards = tuple(shard_name(i) for i in range(count))
    placement = tuple(
        draw(st.lists(st.sampled_from(shards), min_size=partitions, max_size=partitions))
    )
    return ShardMap(draw(st.integers(1, 10**9)), shards, placement)


# ------------------------------------------------------------------ partition lists


def test_the_cli_forms_parse() -> None:
    assert parse_partitions("0-63", 256) == tuple(range(64))
    assert parse_partitions("0-15,32,40-47", 256) == (*range(16), 32, *range(40, 48))
    assert parse_partitions(" 7 , 3-4 ", 8) == (3, 4, 7)
    assert parse_partitions("255", 256) == (255,)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "names no partition"),
        ("  ", "names no partition"),
        ("0-15,,32", "empty item between commas"),
        ("0-15,", "empty item between commas"),
        ("a-b", "'a-b' is neither a partition nor a range"),
        ("-3", "neither a partition nor a range"),
        ("1--3", "neither a partition nor a range"),
        ("0x10", "neither a partition nor a range"),
        ("\u0663", "neither a partition nor a range"),  # a non-ASCII digit
        ("40-32", "range 40-32 runs backwards: write 32-40"),
        ("250-256", "partition 256 (in 250-256) is out of range: this cluster has 256"),
        ("999999", "partition 999999 (in 999999) is out of range"),
        ("1234567", "neither a partition nor a range"),
        ("0-15,10-20", "partition 10 is listed twice (in 0-15 and 10-20)"),
        ("3,3", "partition 3 is listed twice"),
    ],
)
def test_a_bad_list_says_what_to_fix(text: str, says: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        parse_partitions(text, 256)
    assert caught.value.field == "partitions"
    assert says in caught.value.message


def test_a_list_past_its_bound_is_refused_before_it_is_read() -> None:
    with pytest.raises(InvalidArgument, match="characters long"):
        parse_partitions("1," * (MAX_PARTITION_SPEC // 2 + 1), 256)


@given(st.sets(st.integers(0, 999), min_size=1), st.integers(1000, 32767))
def test_format_reads_back_as_the_same_partitions(ps: set[int], partitions: int) -> None:
    text = format_partitions(ps)
    assert parse_partitions(text, partitions) == tuple(sorted(ps))
    assert len(text) <= len(",".join(map(str, sorted(ps))))  # ranges only ever shorten it


def test_format_writes_runs_as_ranges() -> None:
    assert format_partitions([32, *range(16), *range(40, 48)]) == "0-15,32,40-47"
    assert format_partitions([]) == ""


# ------------------------------------------------------------------ the map


def test_a_single_store_is_shard_0_holding_everything_at_version_1() -> None:
    m = single(256)
    assert (m.version, m.shards, m.partitions) == (1, ("shard-0",), 256)
    assert m.held_by("shard-0") == tuple(range(256))
    assert m.sizes() == {"shard-0": 256}


def test_shard_names_are_numbered_and_checked() -> None:
    assert [shard_name(i) for i in (0, 1, 10)] == ["shard-0", "shard-1", "shard-10"]
    assert shard_number("shard-12") == 12
    for bad in ("shard-01", "shard-", "shard--1", "Shard-1", "shard-1 ", "db-1", "shard-1024"):
        with pytest.raises(ValueError, match="is not a shard name"):
            shard_number(bad)


def test_adding_a_shard_registers_the_next_name_and_bumps_the_version() -> None:
    m = single(16).with_shard().with_shard()
    assert (m.version, m.shards) == (3, ("shard-0", "shard-1", "shard-2"))
    assert m.sizes() == {"shard-0": 16, "shard-1": 0, "shard-2": 0}


@pytest.mark.parametrize(
    ("version", "shards", "placement", "says"),
    [
        (0, ("shard-0",), ("shard-0",), "version must be an integer >= 1"),
        (True, ("shard-0",), ("shard-0",), "version must be an integer >= 1"),
        (1, (), ("shard-0",), "must name 1..1024 shards"),
        (1, ("shard-1", "shard-0"), ("shard-0",), "listed once each, by number"),
        (1, ("shard-0", "shard-0"), ("shard-0",), "listed once each, by number"),
        (1, ("db",), ("db",), "'db' is not a shard name"),
        (1, ("shard-0",), (), "must place 1..32767 partitions"),
        (1, ("shard-0",), ("shard-0", "shard-1"), "partition 1 is on 'shard-1', which is not"),
    ],
)
def test_a_map_that_breaks_a_rule_cannot_be_made(
    version: int, shards: tuple[str, ...], placement: tuple[str, ...], says: str
) -> None:
    with pytest.raises(ShardMapInvalid, match=says):
        ShardMap(version, shards, placement)


def test_a_move_returns_a_new_map_one_version_up() -> None:
    m = single(256).with_shard()
    (move,) = m.plan_move(parse_partitions("0-63", 256), "shard-1")
    assert move == Move(tuple(range(64)), "shard-0", "shard-1")
    after = m.moved(move)
    assert after.version == m.version + 1
    assert after.held_by("shard-1") == tuple(range(64))
    assert after.held_by("shard-0") == tuple(range(64, 256))
    assert m.held_by("shard-0") == tuple(range(256))  # the old map is unchanged


def test_a_move_from_several_shards_is_one_move_per_source() -> None:
    m = single(8).with_shard().with_shard()
    m = m.moved(Move((0, 1), "shard-0", "shard-1"))
    moves = m.plan_move([0, 1, 2, 5], "shard-2")
    assert moves == (Move((2, 5), "shard-0", "shard-2"), Move((0, 1), "shard-1", "shard-2"))
    # partitions already on the target are left out
    assert m.plan_move([0, 4], "shard-1") == (Move((4,), "shard-0", "shard-1"),)


def test_a_bad_move_says_what_to_fix() -> None:
    m = single(8).with_shard()
    with pytest.raises(InvalidArgument, match=r"no shard named 'shard-7' \(known: shard-0"):
        m.plan_move([0], "shard-7")
    with pytest.raises(InvalidArgument, match="0-3 on shard-0 already: nothing to move"):
        m.plan_move(range(4), "shard-0")
    with pytest.raises(InvalidArgument, match="partition 8 is out of range"):
        m.plan_move([8], "shard-1")


def test_a_stale_move_is_refused_whole() -> None:
    m = single(8).with_shard().with_shard()
    (move,) = m.plan_move([0, 1, 2], "shard-1")
    now = m.moved(Move((2,), "shard-0", "shard-2"))  # someone else moved partition 2 first
    with pytest.raises(ShardMapConflict, match="partition 2 is on shard-2, not shard-0"):
        now.moved(move)
    with pytest.raises(ShardMapConflict, match="has no shard-5"):
        m.moved(Move((0,), "shard-0", "shard-5"))
    with pytest.raises(ShardMapConflict, match="changes nothing"):
        m.moved(Move((0,), "shard-0", "shard-0"))


@given(maps(), st.data())
def test_every_move_keeps_every_partition_mapped_exactly_once(
    m: ShardMap, data: st.DataObject
) -> None:
    target = data.draw(st.sampled_from(m.shards))
    wanted = data.draw(st.sets(st.integers(0, m.partitions - 1), min_size=1))
    if all(m.shard_of(p) == target for p in wanted):
        return
    moves = m.plan_move(wanted, target)
    after = m.moved_all(moves)
    assert after.version == m.version + len(moves)
    assert sum(after.sizes().values()) == m.partitions
    for p in range(m.partitions):
        assert after.shard_of(p) == (target if p in wanted else m.shard_of(p))


# ------------------------------------------------------------------ rebalance


def _fewest_moves(m: ShardMap) -> int:
    """What an even spread must move at least: the best choice of which shards hold one more."""
    sizes = list(m.sizes().values())
    base, extra = divmod(m.partitions, len(sizes))
    best = None
    for bigger in itertools.combinations(range(len(sizes)), extra):
        quota = [base + (1 if i in bigger else 0) for i in range(len(sizes))]
        cost = sum(max(0, s - q) for s, q in zip(sizes, quota, strict=True))
        best = cost if best is None else min(best, cost)
    assert best is not None
    return best


@given(maps())
def test_a_rebalance_evens_the_shards_moving_the_fewest(m: ShardMap) -> None:
    plan = m.plan_rebalance()
    after = m.moved_all(plan)
    sizes = after.sizes()
    assert max(sizes.values()) - min(sizes.values()) <= 1
    moved = [p for move in plan for p in move.partitions]
    assert len(moved) == len(set(moved)) == _fewest_moves(m)
    before = m.sizes()
    givers = {move.source for move in plan}
    takers = {move.target for move in plan}
    assert not givers & takers  # no shard both gives and takes
    for shard in givers:  # partitions move only off over-full shards
        assert before[shard] > sizes[shard] >= m.partitions // len(m.shards)
    for move in plan:
        assert all(m.shard_of(p) == move.source for p in move.partitions)


@given(maps())
def test_a_rebalance_is_deterministic_and_settles(m: ShardMap) -> None:
    plan = m.plan_rebalance()
    copy = ShardMap.from_json(m.to_json())
    assert copy.plan_rebalance() == plan
    assert m.moved_all(plan).plan_rebalance() == ()


def test_a_rebalance_onto_a_new_shard() -> None:
    m = single(256).with_shard()
    assert m.plan_rebalance() == (Move(tuple(range(128, 256)), "shard-0", "shard-1"),)
    three = m.moved_all(m.plan_rebalance()).with_shard()
    plan = three.plan_rebalance()
    assert [(x.source, x.target, len(x.partitions)) for x in plan] == [
        ("shard-0", "shard-2", 42),
        ("shard-1", "shard-2", 43),
    ]
    assert three.moved_all(plan).sizes() == {"shard-0": 86, "shard-1": 85, "shard-2": 85}


# ------------------------------------------------------------------ the etcd form


@given(maps(max_partitions=2000))
def test_json_round_trips(m: ShardMap) -> None:
    assert ShardMap.from_json(m.to_json()) == m
    assert ShardMap.from_json(m.to_json().encode()) == m


def test_json_is_readable_in_etcd() -> None:
    m = single(256).with_shard()
    m = m.moved_all(m.plan_rebalance())
    assert json.loads(m.to_json()) == {
        "format": 1,
        "version": 3,
        "partitions": 256,
        "shards": {"shard-0": "0-127", "shard-1": "128-255"},
    }


def test_the_largest_map_fits_its_bound() -> None:
    shards = ("shard-0", "shard-1")
    m = ShardMap(1, shards, tuple(shards[p % 2] for p in range(32767)))
    assert len(m.to_json()) < MAX_MAP_BYTES // 4
    assert ShardMap.from_json(m.to_json()) == m


def _doc(**change: object) -> str:
    doc: dict[str, object] = {
        "format": 1,
        "version": 4,
        "partitions": 8,
        "shards": {"shard-0": "0-3", "shard-1": "4-7"},
    }
    doc.update(change)
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "not valid JSON"),
        ("{", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        ("[]", "exactly format, version, partitions, shards"),
        (_doc(extra=1), "exactly format, version, partitions, shards"),
        (_doc(format=2), "format 2 is unknown to this version (it reads 1): upgrade the node"),
        (_doc(format=True), "format True is unknown"),
        (_doc(version=0), "version must be an integer >= 1"),
        (_doc(version="4"), "version must be an integer >= 1"),
        (_doc(version=4.0), "version must be an integer >= 1"),
        (_doc(partitions=0), "partitions must be in 1..32767"),
        (_doc(partitions=40000), "partitions must be in 1..32767"),
        (_doc(shards=["shard-0"]), "must map each name to its partition list"),
        (_doc(shards={"shard-0": [0, 1]}), "must map each name to its partition list"),
        (_doc(shards={"db-0": "0-7"}), "'db-0' is not a shard name"),
        (
            _doc(shards={"shard-0": "0-4", "shard-1": "4-7"}),
            "partition 4 is held by shard-0 and shard-1",
        ),
        (_doc(shards={"shard-0": "0-3", "shard-1": "5-7"}), "no shard holds partitions 4"),
        (_doc(shards={"shard-0": "0-3", "shard-1": "4-8"}), "shard-1's partitions partition 8"),
        (_doc(shards={"shard-0": "0-3", "shard-1": "4-x"}), "shard-1's partitions '4-x'"),
        (_doc(shards={"shard-0": "", "shard-1": ""}), "no shard holds partitions 0-7"),
        (_doc(shards={"shard-0": "0-3", "shard-2": "4-7"}), None),  # gaps in numbers are fine
        (
            '{"format":1,"version":4,"partitions":8,"shards":{"shard-0":"0-7"},"version":9}',
            "key 'version' appears twice",
        ),
        (
            '{"format":1,"version":4,"partitions":8,'
            '"shards":{"shard-0":"0-7","shard-1":"","shard-1":"0-7"}}',
            "key 'shard-1' appears twice",
        ),
        ("[" * 100_000, "not valid JSON"),
        (" " * (MAX_MAP_BYTES + 1), "more than"),
    ],
)
def test_a_corrupt_map_is_refused_whole(text: str | bytes, says: str | None) -> None:
    if says is None:
        assert ShardMap.from_json(text).shards == ("shard-0", "shard-2")
        return
    with pytest.raises(ShardMapInvalid) as caught:
        ShardMap.from_json(text)
    assert says in caught.value.message
