"""A coordinator's route answer is read strictly: a hostile answer is a ProtocolError."""

from typing import Any

import pytest

from netopt.cache.shared import read_route
from netopt.errors import ProtocolError

IDS = ["a" * 64, "b" * 64, "c" * 64]


def test_a_good_answer_names_chunks_by_id() -> None:
    route = read_route(
        {"peers": {"hk-2": [0, 2]}, "endpoints": {"hk-2": "127.0.0.1:7"}, "origin": [1],
         "wait": [], "retry_after_s": 0.5},
        IDS,
    )  # fmt: skip
    assert route.peers == {"hk-2": [IDS[0], IDS[2]]}
    assert route.endpoints == {"hk-2": "127.0.0.1:7"}
    assert route.origin == [IDS[1]]
    assert route.retry_after_s == 0.5


@pytest.mark.parametrize(
    "answer",
    [
        [],
        {"peers": []},
        {"peers": {"hk-2": [3]}},
        {"peers": {"hk-2": [-1]}},
        {"peers": {"hk-2": [True]}},
        {"peers": {"../etc": [0]}},
        {"peers": {"hk-2": "0"}},
        {"origin": [0.0]},
        {"wait": {"0": 1}},
        {"endpoints": {"hk-2": 7}},
        {"endpoints": {"hk-2": "x" * 400}},
        {"retry_after_s": "soon"},
        {"retry_after_s": 1e9},
        {"origin": list(range(70000))},
    ],
)
def test_a_malformed_answer_is_a_protocol_error(answer: Any) -> None:
    with pytest.raises(ProtocolError, match="route answer"):
        read_route(answer, IDS)
