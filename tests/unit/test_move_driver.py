"""The move driver's state machine, with a fake etcd book and a fake mover (pure: no I/O).

The real etcd and two real databases are in tests/integration/test_moves.py."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import pytest

from chronoq.coordinator.move_book import MoveLost, Stored
from chronoq.coordinator.moves import MoveDriver
from chronoq.errors import CoordinatorUnavailable, StoreUnavailable
from chronoq.moves import (
    MoveRecord,
    MoveRecordInvalid,
    Phase,
    Recovery,
    recovery,
)
from chronoq.shardmap import Move, ShardMap, single


class FakeBook:
    """The etcd side: records, move keys, the map; one revision counter like etcd's."""

    def __init__(self, current: ShardMap) -> None:
        self.rev = 1
        self.map = current
        self.map_rev = 1
        self.records_: dict[str, tuple[MoveRecord, int, int]] = {}
        self.keys: dict[str, int] = {}  # move id -> token (create revision)
        self.versions: dict[str, int | None] = {"n1": None}
        self.commits = 0
        self.fail_commits = 0  # commit attempts that raise CoordinatorUnavailable
        self.log: list[str] = []

    def _bump(self) -> int:
        self.rev += 1
        return self.rev

    def add(self, rec: MoveRecord) -> None:
        rev = self._bump()
        self.records_[rec.id] = (rec, rev, rev)

    async def records(self) -> list[Stored]:
        return sorted(
            (Stored(r, m, c) for r, m, c in self.records_.values()),
            key=lambda s: s.create_revision,
        )

    async def get(self, move_id: str) -> Stored | None:
        found = self.records_.get(move_id)
        return Stored(*found) if found else None

    async def claim(self, move_id: str) -> int | None:
        if move_id in self.keys:
            return None
        self.keys[move_id] = self._bump()
        return self.keys[move_id]

    async def held(self, move_id: str) -> bool:
        return move_id in self.keys

    async def release(self, move_id: str, token: int) -> None:
        if self.keys.get(move_id) == token:
            del self.keys[move_id]

    async def put(self, record: MoveRecord, token: int) -> int:
        if self.keys.get(record.id) != token:
            raise MoveLost("lost")
        _, _, created = self.records_[record.id]
        rev = self._bump()
        self.records_[record.id] = (record, rev, created)
        self.log.append(f"record {record.phase.value}")
        return rev

    async def read_map(self) -> tuple[ShardMap, int]:
        return self.map, self.map_rev

    async def commit(
        self,
        record: MoveRecord,
        record_revision: int,
        new_map: ShardMap,
        map_revision: int,
        token: int,
    ) -> bool:
        if self.fail_commits:
            self.fail_commits -= 1
            raise CoordinatorUnavailable("etcd: commit failed: leader lost")
        _, rec_rev, created = self.records_[record.id]
        if (
            map_revision != self.map_rev
            or rec_rev != record_revision
            or self.keys.get(record.id) != token
        ):
            return False
        rev = self._bump()
        self.map, self.map_rev = new_map, rev
        self.records_[record.id] = (record, rev, created)
        self.commits += 1
        self.log.append(f"commit map v{new_map.version} + record {record.phase.value}")
        return True

    def map_versions(self) -> Mapping[str, int | None]:
        return self.versions


class FakeMover:
    def __init__(self, book: FakeBook, move_id: str, token: int, script: Script) -> None:
        self.book, self.move_id, self.token, self.script = book, move_id, token, script

    def _seen(self, name: str) -> None:
        rec = self.book.records_[self.move_id][0]
        # The record says the phase before the phase acts.
        self.script.calls.append((name, rec.phase.value, self.token))
        self.book.log.append(f"mover {name}")
        if name in self.script.fail:
            raise StoreUnavailable(f"shard down during {name}")

    async def prepare(self) -> None:
        self._seen("prepare")

    async def copy(self) -> int:
        self._seen("copy")
        return 1000

    async def catch_up(self) -> int:
        self._seen("catch_up")
        return self.script.rounds.pop(0) if self.script.rounds else 0

    async def cut_over(self, next_version: int) -> None:
        self._seen("cut_over")
        self.script.cut_versions.append(next_version)
        if self.script.on_cut is not None:
            self.script.on_cut()

    async def rollback(self) -> None:
        self._seen("rollback")

    async def clean_up(self) -> int:
        self._seen("clean_up")
        return 1000


@dataclasses.dataclass
class Script:
    calls: list[tuple[str, str, int]] = dataclasses.field(default_factory=list)
    fail: set[str] = dataclasses.field(default_factory=set)
    rounds: list[int] = dataclasses.field(default_factory=list)
    cut_versions: list[int] = dataclasses.field(default_factory=list)
    on_cut: Any = None
    groups: list[tuple[tuple[int, ...], bool]] = dataclasses.field(default_factory=list)


class Stores:
    async def store(self, shard: str) -> str:
        return shard


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds


def setup(
    *, leads: bool = True, **driver: Any
) -> tuple[FakeBook, Script, MoveDriver, MoveRecord, Clock]:
    base = single(16).with_shard()  # version 2: shard-0 holds all, shard-1 nothing
    book = FakeBook(base)
    script = Script()
    clock = Clock()

    def make(_s: Any, _t: Any, parts: tuple[int, ...], move_id: str, token: int) -> FakeMover:
        return FakeMover(book, move_id, token, script)

    drv = MoveDriver(
        book,
        Stores(),
        make,
        node_id="n1",
        leads=lambda: leads,
        statement_deadline=5.0,
        ack_wait=10.0,
        now=clock.now,
        monotonic=clock.now,
        sleep=clock.sleep,
        **driver,
    )
    rec = MoveRecord.requested(Move(tuple(range(8)), "shard-0", "shard-1"), 2, clock.t)
    book.add(rec)
    return book, script, drv, rec, clock


async def test_a_move_runs_every_phase_recording_each_before_it_acts() -> None:
    book, script, drv, _rec, _clock = setup()
    book.versions = {"n1": 3, "n2": 3}
    script.rounds = [900, 10]
    done = await drv.step()
    assert done is not None and done.phase is Phase.DONE
    assert [(n, p) for n, p, _t in script.calls] == [
        ("prepare", "prepare"),
        ("copy", "copy"),
        ("catch_up", "catch_up"),
        ("catch_up", "catch_up"),  # the first round changed more than a small round
        ("cut_over", "cut_over"),
        ("clean_up", "clean_up"),
    ]
    assert script.cut_versions == [3]
    assert book.map.version == 3
    assert book.map.held_by("shard-1") == tuple(range(8))
    assert book.commits == 1
    # The map and the committed record went in one transaction, after the cut-over.
    assert book.log.index("mover cut_over") < book.log.index("commit map v3 + record committed")
    assert not book.keys  # the move key is released at the end
    assert done.rows_copied == 1000 + 900 + 10 and done.rounds == 2


async def test_the_source_is_cleaned_only_when_every_member_routes_by_the_new_map() -> None:
    book, script, drv, _rec, clock = setup()
    book.versions = {"n1": 3, "n2": 2}  # n2 still routes by version 2
    left = await drv.step()
    assert left is not None and left.phase is Phase.COMMITTED
    assert "clean_up" not in [n for n, _p, _t in script.calls]
    book.versions = {"n1": 3, "n2": None}  # a member reporting nothing is not counted as ready
    left = await drv.step()
    assert left is not None and left.phase is Phase.COMMITTED
    book.versions = {"n1": 3, "n2": 3}
    done = await drv.step()
    assert done is not None and done.phase is Phase.DONE
    # The longest statement deadline had passed since the commit, too.
    assert clock.t >= done.committed_at + drv.statement_deadline


async def test_a_record_left_before_the_commit_is_rolled_back_by_the_next_driver() -> None:
    book, script, drv, rec, clock = setup()
    old = rec.at(Phase.COPY, clock.t, driver="n0", token=2)
    book.records_[rec.id] = (old, 5, book.records_[rec.id][2])
    done = await drv.step()
    assert done is not None and done.phase is Phase.ROLLED_BACK
    assert "interrupted in phase copy" in done.error
    assert [n for n, _p, _t in script.calls] == ["rollback"]
    token = script.calls[0][2]
    assert token > 2  # the new driver's token is newer than the dead one's
    assert book.map.version == 2 and book.commits == 0


async def test_a_record_left_after_the_commit_is_finished_not_undone() -> None:
    book, script, drv, rec, clock = setup()
    moved = book.map.moved(rec.move)
    book.map, book.map_rev = moved, 7
    left = rec.at(
        Phase.COMMITTED, clock.t, driver="n0", token=2, next_version=3, committed_at=clock.t - 60
    )
    book.records_[rec.id] = (left, 7, book.records_[rec.id][2])
    book.versions = {"n1": 3}
    done = await drv.step()
    assert done is not None and done.phase is Phase.DONE
    assert [n for n, _p, _t in script.calls] == ["clean_up"]
    assert book.map == moved  # the map is not written again


async def test_a_shard_failing_mid_copy_rolls_the_move_back() -> None:
    book, script, drv, _rec, _clock = setup()
    script.fail = {"copy"}
    done = await drv.step()
    assert done is not None and done.phase is Phase.ROLLED_BACK
    assert "failed in phase copy" in done.error and "shard down" in done.error
    assert [n for n, _p, _t in script.calls] == ["prepare", "copy", "rollback"]
    assert book.map.version == 2


async def test_a_map_changed_during_the_cut_over_rolls_back_instead_of_committing() -> None:
    book, script, drv, _rec, _clock = setup()

    def add_shard_meanwhile() -> None:
        book.map, book.map_rev = book.map.with_shard(), 99

    script.on_cut = add_shard_meanwhile
    done = await drv.step()
    assert done is not None and done.phase is Phase.ROLLED_BACK
    assert "shard map changed during the cut-over" in done.error
    assert book.commits == 0
    assert book.map.held_by("shard-1") == ()  # the move never reached the map
    assert [n for n, _p, _t in script.calls][-1] == "rollback"


async def test_a_commit_whose_answer_was_lost_is_read_back_not_repeated() -> None:
    book, _script, drv, _rec, _clock = setup()
    book.versions = {"n1": 3}
    book.fail_commits = 2  # etcd leader loss: the attempts fail, the next one goes through
    done = await drv.step()
    assert done is not None and done.phase is Phase.DONE
    assert book.commits == 1 and book.map.version == 3


async def test_a_commit_that_never_goes_through_rolls_back_after_the_freeze_limit() -> None:
    book, _script, drv, _rec, _clock = setup(freeze_budget=0.5)
    book.fail_commits = 10_000
    done = await drv.step()
    assert done is not None and done.phase is Phase.ROLLED_BACK
    assert "freeze budgets" in done.error
    assert book.commits == 0 and book.map.version == 2


async def test_a_driver_that_lost_its_key_stops_writing() -> None:
    book, script, drv, rec, _clock = setup()

    def key_taken_over() -> None:
        book.keys[rec.id] = 10_000  # the lease lapsed and another node took the move key

    script.on_cut = key_taken_over
    left = await drv.step()
    assert left is not None
    assert book.commits == 0
    stored = book.records_[rec.id][0]
    assert stored.phase is Phase.CUT_OVER  # nothing written after the key was lost
    assert [n for n, _p, _t in script.calls][-1] == "cut_over"


async def test_a_move_driven_by_a_live_node_is_left_alone_and_a_follower_drives_nothing() -> None:
    book, script, drv, rec, _clock = setup()
    book.keys[rec.id] = 3  # held by another node's lease
    assert await drv.step() is None
    assert not script.calls
    book2, script2, follower, _rec2, _c = setup(leads=False)
    assert await follower.step() is None
    assert not script2.calls and not book2.keys


async def test_a_move_the_map_no_longer_allows_ends_without_acting() -> None:
    book, script, drv, _rec, _clock = setup()
    book.map = book.map.moved(Move((0,), "shard-0", "shard-1"))  # partition 0 moved meanwhile
    done = await drv.step()
    assert done is not None and done.phase is Phase.ROLLED_BACK
    assert "partition 0 is on shard-1" in done.error
    assert not script.calls


# ---------------------------------------------------------------------- records


def test_records_round_trip_and_junk_is_refused_whole() -> None:
    rec = MoveRecord.requested(Move((0, 1, 2, 5), "shard-0", "shard-2"), 4, 12.5)
    rec = rec.at(Phase.CATCH_UP, 13.0, rows_copied=7, rounds=1, driver="n1", token=9)
    assert MoveRecord.from_json(rec.to_json()) == rec
    assert json.loads(rec.to_json())["partitions"] == "0-2,5"
    good = json.loads(rec.to_json())
    for bad in (
        b"{not json",
        b"[]",
        json.dumps({**good, "phase": "teleport"}).encode(),
        json.dumps({**good, "id": "../../owners/1"}).encode(),
        json.dumps({**good, "source": "db-1"}).encode(),
        json.dumps({**good, "partitions": "3-1"}).encode(),
        b"x" * 70_000,
    ):
        with pytest.raises(MoveRecordInvalid):
            MoveRecord.from_json(bad)


def test_recovery_rolls_back_before_the_commit_and_goes_forward_after() -> None:
    assert recovery(Phase.REQUESTED) is Recovery.START
    for phase in (Phase.PREPARE, Phase.COPY, Phase.CATCH_UP, Phase.CUT_OVER, Phase.ROLLING_BACK):
        assert recovery(phase) is Recovery.ROLL_BACK
    for phase in (Phase.COMMITTED, Phase.CLEAN_UP):
        assert recovery(phase) is Recovery.FINISH
    for phase in (Phase.DONE, Phase.ROLLED_BACK):
        assert recovery(phase) is Recovery.NOTHING


# ---------------------------------------------------------------------- cut-over in groups


@dataclasses.dataclass(frozen=True)
class LastRound:
    listed: int
    seconds: float


class GroupedMover(FakeMover):
    """A mover whose last round listed ``listed`` rows in ``seconds`` and that hands out
    groups of itself, each cut over on its own."""

    def __init__(self, *args: Any, listed: int, seconds: float, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.last_round = LastRound(listed, seconds)
        self.partitions: tuple[int, ...] = ()
        self.owns_index = False

    def group(self, partitions: tuple[int, ...], *, owns_index: bool = False) -> GroupedMover:
        part = GroupedMover(
            self.book, self.move_id, self.token, self.script,
            listed=self.last_round.listed, seconds=self.last_round.seconds,
        )  # fmt: skip
        part.partitions, part.owns_index = partitions, owns_index
        self.script.groups.append((partitions, owns_index))
        return part


def grouped_setup(
    listed: int, seconds: float, **driver: Any
) -> tuple[FakeBook, Script, MoveDriver, MoveRecord, Clock]:
    book, script, drv, rec, clock = setup(**driver)

    def make(_s: Any, _t: Any, parts: tuple[int, ...], move_id: str, token: int) -> FakeMover:
        return GroupedMover(book, move_id, token, script, listed=listed, seconds=seconds)

    drv._make_move = make
    return book, script, drv, rec, clock


def test_groups_are_sized_from_the_last_rounds_rate_to_fit_the_budget() -> None:
    from chronoq.moves import cut_over_groups

    # 64 partitions listed in 3.2 s: 0.05 s each; half a 1 s budget is 10 partitions.
    groups = cut_over_groups(range(64), 1_280_000, 3.2, 1.0)
    assert [len(g) for g in groups] == [10] * 6 + [4]
    assert [p for g in groups for p in g] == list(range(64))
    # A fast round, or nothing listed: one group.
    assert cut_over_groups(range(64), 10_000, 0.05, 1.0) == [tuple(range(64))]
    assert cut_over_groups(range(8), 0, 0.0, 1.0) == [tuple(range(8))]
    # A partition alone larger than the budget is still cut over (alone).
    assert cut_over_groups(range(3), 3_000_000, 30.0, 1.0) == [(0,), (1,), (2,)]


async def test_a_move_larger_than_the_freeze_budget_cuts_over_and_commits_a_group_at_a_time() -> (
    None
):
    # 8 partitions listed in 4 s: 0.5 s each, so groups of one partition for a 1 s budget.
    book, script, drv, _rec, _clock = grouped_setup(80_000, 4.0)
    book.versions = {"n1": 10, "n2": 10}
    done = await drv.step()
    assert done is not None and done.phase is Phase.DONE
    assert [n for n, _p, _t in script.calls].count("cut_over") == 8
    assert [g for g, _o in script.groups if len(g) == 1] == [(p,) for p in range(8)]
    # Each group is its own commit: map v+1 with that group moved, the record's ``cut``
    # growing; the last one makes the record committed.
    assert script.cut_versions == list(range(3, 11))
    assert book.commits == 8 and book.map.version == 10
    assert book.map.held_by("shard-1") == tuple(range(8))
    assert done.cut == tuple(range(8)) and done.group == () and done.returned == ()
    assert book.log.count("commit map v10 + record committed") == 1
    assert book.log.count("commit map v3 + record catch_up") == 1


async def test_a_driver_lost_after_some_groups_rolls_back_the_rest_and_finishes_the_cut() -> None:
    book, script, drv, rec, clock = grouped_setup(80_000, 4.0)
    # A dead driver committed partitions 0-2 (map v3..v5) and was cutting over 3.
    book.map = book.map.moved(Move((0, 1, 2), "shard-0", "shard-1"))
    book.map = ShardMap.from_json(
        json.dumps({**json.loads(book.map.to_json()), "version": 5}).encode()
    )
    left = rec.at(
        Phase.CUT_OVER, clock.t, driver="n0", token=2, next_version=6, cut=(0, 1, 2),
        group=(3,), committed_at=clock.t - 60,
    )  # fmt: skip
    book.records_[rec.id] = (left, 9, book.records_[rec.id][2])
    book.versions = {"n1": 5}
    done = await drv.step()
    assert done is not None and done.phase is Phase.DONE
    assert [n for n, _p, _t in script.calls] == ["rollback", "clean_up"]
    # The rollback covered only what was not committed; the clean-up only what was, and it
    # drops the move index (the move's last step).
    assert script.groups == [((3, 4, 5, 6, 7), False), ((0, 1, 2), True)]
    assert done.cut == (0, 1, 2) and done.returned == (3, 4, 5, 6, 7)
    assert book.map.held_by("shard-1") == (0, 1, 2) and book.map.version == 5  # not undone
    assert book.commits == 0


async def test_a_group_that_overruns_its_freeze_is_split_and_tried_again() -> None:
    from chronoq.store.mover import FreezeOverrun

    book, script, drv, _rec, _clock = grouped_setup(8_000, 0.01)  # one group of 8
    book.versions = {"n1": 4, "n2": 4}
    overruns = [1]

    def overrun() -> None:
        if overruns:
            overruns.pop()
            raise FreezeOverrun("the frozen last round took over 5.0 s")

    script.on_cut = overrun
    done = await drv.step()
    assert done is not None and done.phase is Phase.DONE
    assert [g for g, _o in script.groups] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert script.cut_versions == [3, 3, 4]  # the whole, then its two halves
    assert book.map.version == 4 and book.map.held_by("shard-1") == tuple(range(8))
