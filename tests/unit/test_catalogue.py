"""The chunk catalogue's decisions: peers first, the border once, leases that expire."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netopt.coordinator.catalogue import Catalogue, CatalogueError, RouteRequest, start_fraction

MID = "ab" * 32
REGIONS = {"hk-1": "hk", "hk-2": "hk", "hk-3": "hk", "us-1": "us"}
LIVE = set(REGIONS)


def req(node: str, **kw: object) -> RouteRequest:
    return RouteRequest(node=node, dataset="ds", manifest_id=MID, chunk_count=10, **kw)  # type: ignore[arg-type]


def test_first_asker_leases_from_origin_and_the_next_waits() -> None:
    cat = Catalogue()
    a = cat.route(req("hk-1", want=(0, 1, 2)), REGIONS, LIVE, 0.0)
    assert a.origin == [0, 1, 2]
    assert a.start_fraction == 0.0
    b = cat.route(req("hk-2", want=(0, 1, 2, 3)), REGIONS, LIVE, 0.1)
    assert b.wait == [0, 1, 2]
    assert b.origin == [3]
    assert b.start_fraction == 0.5


def test_a_held_chunk_comes_from_the_in_region_peer_with_load_spread() -> None:
    cat = Catalogue()
    cat.route(req("hk-1", want=(0, 1, 2, 3)), REGIONS, LIVE, 0.0)
    cat.route(req("hk-1", have=(0, 1, 2, 3)), REGIONS, LIVE, 0.1)
    cat.route(req("hk-2", want=(0, 1, 2, 3)), REGIONS, LIVE, 0.2)
    cat.route(req("hk-2", have=(0, 1, 2, 3)), REGIONS, LIVE, 0.3)
    answer = cat.route(req("hk-3", want=(0, 1, 2, 3)), REGIONS, LIVE, 0.4)
    assert answer.origin == []
    assert answer.wait == []
    assert sorted(answer.peers) == ["hk-1", "hk-2"]
    assert sorted(i for idx in answer.peers.values() for i in idx) == [0, 1, 2, 3]
    assert all(len(idx) == 2 for idx in answer.peers.values())


def test_holders_in_another_region_are_not_peers() -> None:
    cat = Catalogue()
    cat.route(req("us-1", want=(0,)), REGIONS, LIVE, 0.0)
    cat.route(req("us-1", have=(0,)), REGIONS, LIVE, 0.1)
    answer = cat.route(req("hk-1", want=(0,)), REGIONS, LIVE, 0.2)
    assert answer.peers == {}
    assert answer.origin == [0]


def test_a_dead_or_excluded_holder_is_skipped() -> None:
    cat = Catalogue()
    cat.route(req("hk-1", have=(0, 1)), REGIONS, LIVE, 0.0)
    dead = cat.route(req("hk-2", want=(0,)), REGIONS, LIVE - {"hk-1"}, 0.1)
    assert dead.origin == [0]
    excluded = cat.route(req("hk-3", want=(1,), exclude=("hk-1",)), REGIONS, LIVE, 0.2)
    assert excluded.origin == [1]


def test_leases_of_a_silent_session_expire_and_done_frees_them_at_once() -> None:
    cat = Catalogue(session_ttl_s=5.0)
    cat.route(req("hk-1", want=(0, 1)), REGIONS, LIVE, 0.0)
    assert cat.route(req("hk-2", want=(0,)), REGIONS, LIVE, 4.0).wait == [0]
    # hk-1 said nothing for more than 5 s: killed. Its leases pass on.
    assert cat.route(req("hk-2", want=(0,)), REGIONS, LIVE, 6.0).origin == [0]
    cat.route(req("hk-3", want=(2,)), REGIONS, LIVE, 6.0)
    cat.route(req("hk-3", done=True), REGIONS, LIVE, 6.1)
    assert cat.route(req("hk-2", want=(2,)), REGIONS, LIVE, 6.2).origin == [2]


def test_an_excluded_lessee_does_not_block() -> None:
    cat = Catalogue()
    cat.route(req("hk-1", want=(0,)), REGIONS, LIVE, 0.0)
    assert cat.route(req("hk-2", want=(0,), exclude=("hk-1",)), REGIONS, LIVE, 0.1).origin == [0]


def test_bad_indexes_and_counts_are_refused() -> None:
    cat = Catalogue()
    with pytest.raises(CatalogueError, match="outside"):
        cat.route(req("hk-1", want=(10,)), REGIONS, LIVE, 0.0)
    cat.route(req("hk-1", want=(1,)), REGIONS, LIVE, 0.0)
    other = RouteRequest("hk-2", "ds", MID, 11, want=(0,))
    with pytest.raises(CatalogueError, match="has 10 chunks, not 11"):
        cat.route(other, REGIONS, LIVE, 0.0)


def test_start_fractions_spread() -> None:
    assert [start_fraction(r) for r in range(5)] == [0.0, 0.5, 0.25, 0.75, 0.125]


def test_describe_counts_holdings_and_sessions() -> None:
    cat = Catalogue()
    cat.route(req("hk-1", want=(0, 1), have=(2, 3, 3)), REGIONS, LIVE, 0.0)
    (version,) = cat.describe(LIVE, 0.1)
    assert version["holders"] == [{"node": "hk-1", "chunks": 2, "live": True}]
    assert version["sessions"] == [{"node": "hk-1", "region": "hk", "leases": 2}]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["hk-1", "hk-2", "hk-3"]),
            st.lists(st.integers(0, 9), max_size=6),
            st.booleans(),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_within_a_region_each_chunk_is_leased_once_until_held(
    calls: list[tuple[str, list[int], bool]],
) -> None:
    """However the three nodes interleave, a chunk goes to the border at most once while
    its lessee's session lives, and never once any node of the region holds it."""
    cat = Catalogue(session_ttl_s=1e9)
    leased: dict[int, str] = {}
    held: set[int] = set()
    own: dict[str, set[int]] = {}
    for t, (node, wanted, store) in enumerate(calls):
        have = tuple(i for i, n in leased.items() if n == node) if store else ()
        own.setdefault(node, set()).update(have)
        want = [i for i in wanted if i not in own[node]]  # a node never asks for its own
        answer = cat.route(req(node, want=tuple(want), have=have), REGIONS, LIVE, float(t))
        held.update(have)
        for i in answer.origin:
            assert i not in held
            assert leased.get(i, node) == node
            leased[i] = node
        for nodes_idx in answer.peers.values():
            assert set(nodes_idx) <= held


def test_a_stuck_lessees_chunk_can_be_stolen() -> None:
    cat = Catalogue()
    cat.route(req("hk-1", want=(0, 1)), REGIONS, LIVE, 0.0)
    for t in (9.0, 18.0, 27.0, 36.0):
        cat.route(req("hk-1"), REGIONS, LIVE, t)  # alive (it renews), but not delivering
    answer = cat.route(req("hk-2", want=(0, 1), steal=(0,)), REGIONS, LIVE, 40.0)
    assert answer.origin == [0]
    assert answer.wait == [1]
    # hk-1 still reports it (it was slow, not dead): it becomes a holder, nothing breaks.
    cat.route(req("hk-1", have=(0,)), REGIONS, LIVE, 41.0)
    assert cat.route(req("hk-3", want=(0,)), REGIONS, LIVE, 42.0).peers == {"hk-1": [0]}
