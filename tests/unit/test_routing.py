"""Routing: a keyed submit's partition is stable and spread, new ids carry their partition,
and ids minted before still route by hash."""

from __future__ import annotations

import collections
import os
import time
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronoq.buckets import MAX_PARTITIONS, partition_of
from chronoq.errors import InvalidArgument
from chronoq.ids import time_ordered_ids
from chronoq.routing import (
    LAYOUT_BYTE,
    MAX_ID_PARTITIONS,
    carries_partition,
    id_partition,
    key_partition,
    new_task_id_bytes,
    new_task_ids,
    routing_key,
    submit_partition,
    submit_partitions,
)

partition_counts = st.integers(1, MAX_PARTITIONS)
text = st.text(max_size=64)


@given(text, text, partition_counts)
def test_a_key_always_lands_in_the_same_partition(ns: str, key: str, partitions: int) -> None:
    p = key_partition(ns, key, partitions)
    assert 0 <= p < partitions
    assert key_partition(ns, key, partitions) == p
    if key:
        assert submit_partition(ns, [None, "", key], partitions) == p


def test_the_routing_hash_is_pinned() -> None:
    """Part of the data format: stored keyed tasks sit where these values put them."""
    assert [key_partition("default", k, 256) for k in ("order-1", "order-2", "")] == [
        PINNED["order-1"],
        PINNED["order-2"],
        PINNED[""],
    ]
    assert key_partition("tenant-a", "order-1", 32767) == PINNED["tenant-a/32767"]


PINNED = {"order-1": 95, "order-2": 19, "": 239, "tenant-a/32767": 27395}


def test_the_namespace_is_part_of_the_key() -> None:
    """Keys are unique per namespace: the same key of two namespaces need not meet, and the
    length prefix keeps ("ab", "c") apart from ("a", "bc")."""
    spread = {key_partition(f"ns-{i}", "same-key", 32767) for i in range(50)}
    assert len(spread) > 40
    assert key_partition("ab", "c", 32767) != key_partition("a", "bc", 32767)


def test_the_first_present_key_decides() -> None:
    assert routing_key([None, "", "idem", "conc"]) == "idem"
    assert routing_key([None, ""]) is None
    assert submit_partition("ns", ["k1", "k2"], 256) == key_partition("ns", "k1", 256)
    assert submit_partition("ns", [None, "k2"], 256) == key_partition("ns", "k2", 256)


def test_keys_spread_evenly_over_partitions() -> None:
    """20,000 keys over 64 partitions: every partition within 25% of the mean (the expected
    spread of a uniform hash is about 4%; the bound only catches a broken one)."""
    counts = collections.Counter(key_partition("ns", f"key-{i}", 64) for i in range(20_000))
    mean = 20_000 / 64
    assert len(counts) == 64
    assert all(abs(n - mean) < 0.25 * mean for n in counts.values())


def test_keyless_submits_spread_evenly() -> None:
    counts = collections.Counter(submit_partition("ns", [None], 64) for _ in range(20_000))
    mean = 20_000 / 64
    assert len(counts) == 64
    assert all(abs(n - mean) < 0.25 * mean for n in counts.values())


routes = st.lists(st.tuples(st.sampled_from(["", "ns", "tenant-a"]), st.none() | text))


@given(routes, partition_counts)
def test_a_batch_routes_each_keyed_task_as_its_own_submit_would(
    routes: list[tuple[str, str | None]], partitions: int
) -> None:
    """The store routes a batch with ``submit_partitions``: a key's partition must not depend
    on the batch it came in (a retry in another batch would miss the first task)."""
    out = submit_partitions(routes, partitions)
    assert len(out) == len(routes)
    for (ns, key), p in zip(routes, out, strict=True):
        assert 0 <= p < partitions
        if key:
            assert p == submit_partition(ns, [key], partitions)


def test_keyless_tasks_of_a_batch_spread_evenly() -> None:
    counts = collections.Counter(submit_partitions([("ns", None)] * 20_000, 64))
    mean = 20_000 / 64
    assert len(counts) == 64
    assert all(abs(n - mean) < 0.25 * mean for n in counts.values())


@given(st.binary(min_size=4, max_size=4), partition_counts)
def test_a_keyless_partition_comes_from_its_draw(draw: bytes, partitions: int) -> None:
    p = submit_partition("ns", [], partitions, draw)
    assert p == int.from_bytes(draw, "big") % partitions


# ------------------------------------------------------------------ ids


@given(st.lists(st.integers(0, MAX_PARTITIONS - 1), min_size=1, max_size=50))
def test_a_new_id_gives_its_partition_back_exactly(ps: list[int]) -> None:
    ids = new_task_ids(ps, time.time_ns() // 1_000_000)
    assert [id_partition(i, MAX_PARTITIONS) for i in ids] == ps
    assert [id_partition(i.bytes, MAX_PARTITIONS) for i in ids] == ps


def test_a_new_id_is_an_rfc_9562_version_8_uuid() -> None:
    (raw,) = new_task_id_bytes([300], 1_700_000_000_123)
    u = uuid.UUID(bytes=raw)
    assert u.version == 8
    assert u.variant == uuid.RFC_4122
    assert raw[6] == LAYOUT_BYTE and carries_partition(raw)
    assert int.from_bytes(raw[:6], "big") == 1_700_000_000_123


def test_new_ids_are_time_ordered_beside_old_ones() -> None:
    """Index locality is kept: ids sort by their millisecond first, old and new alike."""
    old = time_ordered_ids(1, 1_000)[0]
    new = new_task_ids([5], 1_001)[0]
    newer_old = time_ordered_ids(1, 1_002)[0]
    assert old.bytes < new.bytes < newer_old.bytes
    assert sorted([newer_old, new, old], key=lambda u: u.bytes) == [old, new, newer_old]


def test_new_ids_stay_unguessable() -> None:
    """54 random bits per (millisecond, partition): 20,000 ids of one partition minted in
    the same millisecond are all distinct, and every random bit takes both values."""
    raw = new_task_id_bytes([7] * 20_000, 1_700_000_000_000)
    assert len(set(raw)) == 20_000
    ones = 0
    zeros = 0
    for r in raw:
        bits = int.from_bytes(r[7:8] + bytes([r[8] & 0x3F]) + r[11:16], "big")
        ones |= bits
        zeros |= ~bits
    mask = (1 << 56) - 1 & ~(0xC0 << 40)  # byte 7, six bits of byte 8, bytes 11-15
    assert ones & mask == mask and zeros & mask == mask


@given(st.binary(min_size=16, max_size=16), st.integers(1, 4096))
def test_old_ids_still_route_by_hash(raw: bytes, partitions: int) -> None:
    """Every id that is not version 8 (the v7 and v4 ids minted before) routes by the hash of
    its 16 bytes, as ``buckets.partition_of`` placed it."""
    if raw[6] >> 4 == 8:
        raw = raw[:6] + bytes([raw[6] & 0x7F]) + raw[7:]  # force another version
    assert not carries_partition(raw)
    assert id_partition(raw, partitions) == partition_of(raw, partitions)


def test_minted_v7_and_v4_ids_route_by_hash() -> None:
    for u in [
        *time_ordered_ids(100, time.time_ns() // 1_000_000),
        *(uuid.uuid4() for _ in range(100)),
    ]:
        assert id_partition(u, 256) == partition_of(u.bytes, 256)


def test_an_id_this_cluster_did_not_mint_is_refused() -> None:
    (raw,) = new_task_id_bytes([300], 1)
    with pytest.raises(InvalidArgument, match="names partition 300; this cluster has 256"):
        id_partition(raw, 256)
    other = raw[:6] + bytes([0x82]) + raw[7:]  # version 8, another layout
    with pytest.raises(InvalidArgument, match="id layout 2, unknown to this node"):
        id_partition(other, 256)
    with pytest.raises(InvalidArgument, match="16 bytes, not 3"):
        id_partition(b"abc", 256)


def test_partitions_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError, match="does not fit in an id"):
        new_task_id_bytes([MAX_ID_PARTITIONS], 1)
    with pytest.raises(ValueError, match="partitions must be in"):
        key_partition("ns", "k", 0)
    with pytest.raises(ValueError, match="partitions must be in"):
        id_partition(os.urandom(16), 0)
