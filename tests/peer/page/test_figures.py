"""What the swarm page draws of a peer's ``/status`` (``figures``): malformed fields (issue 30 item 8:
a ``series`` that is not a list froze every viewer's page) are left out and named, never raised on,
for any JSON value; text and points are capped. Where a daemon may fetch a peer's ``/status`` from
(``status_url``): a plain host and port no narrower in scope than its own."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gossamer.peer.page.figures import MAX_POINTS, MAX_TEXT, figures, status_url

GOOD = {"peer_id": "p1", "health": {"state": "running"}, "bytes_sent": 10, "bytes_received": 20,
        "role_status": {"learner": {"series": {"loss": [[0, 5.0], [1, 4.5]]},
                                    "ledgers": [{"round": 1, "expected": ["a", "b"], "arrived": ["a"], "used": ["a"],
                                                 "rejected": {}, "timed_out": ["b"]}]}}}


def test_a_well_formed_status_is_drawn_whole() -> None:
    out = figures(GOOD)
    assert out["state"] == "running" and out["bytes_sent"] == 10 and out["bytes_received"] == 20
    assert out["series"] == [{"role": "learner", "name": "loss", "points": [[0.0, 5.0], [1.0, 4.5]]}]
    assert out["ledgers"] == [["round 1", "-", "2", "1", "1", "0", "1"]] and out["malformed"] == []


@pytest.mark.parametrize(("change", "named"), [
    ({"role_status": {"learner": {"series": {"loss": 5.0}}}}, "role_status.learner.series.loss"),  # the issue's
    ({"role_status": {"learner": {"series": [1, 2]}}}, "role_status.learner.series"),
    ({"role_status": {"learner": {"series": {"loss": [[0, float("nan")], [1, "x"], [2]]}}}},
     "role_status.learner.series.loss"),
    ({"role_status": {"learner": {"ledgers": {"expected": 1}}}}, "role_status.learner.ledgers"),
    ({"role_status": {"learner": 7}}, "role_status.learner"),
    ({"role_status": "all good"}, "role_status"),
    ({"health": "fine"}, "health"),
    ({"health": {"state": "<script>"}}, "health"),
    ({"bytes_sent": "lots"}, "bytes_sent"),
    ({"bytes_received": [1]}, "bytes_received"),
    ({"bytes_sent": 10**40}, "bytes_sent"),
])
def test_a_malformed_field_is_left_out_and_named(change: dict, named: str) -> None:
    out = figures({**GOOD, **change})
    assert named in out["malformed"], out["malformed"]
    json.dumps(out, allow_nan=False)  # what /swarm sends is plain JSON


def test_points_and_text_are_capped() -> None:
    name = "n" * 10_000
    out = figures({**GOOD, "role_status": {"r" * 500: {"series": {name: [[i, i] for i in range(5 * MAX_POINTS)]}}}})
    [series] = out["series"]
    assert len(series["points"]) == MAX_POINTS and series["points"][-1] == [5 * MAX_POINTS - 1] * 2
    assert len(series["name"]) <= MAX_TEXT and len(series["role"]) <= MAX_TEXT


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner,
                                                                                        max_size=5), max_leaves=40)
status_like = st.fixed_dictionaries({}, optional={"health": json_values, "bytes_sent": json_values,
                                                   "role_status": st.dictionaries(st.sampled_from(["learner", "x"]),
                                                                                  st.fixed_dictionaries({}, optional={
                                                                                      "series": json_values,
                                                                                      "ledgers": json_values}) | json_values,
                                                                                  max_size=2)})


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.one_of(json_values, status_like))
def test_figures_never_raise_and_give_plain_json_for_any_value(status: object) -> None:
    out = figures(status)
    assert set(out) == {"state", "bytes_sent", "bytes_received", "series", "ledgers", "malformed"}
    json.dumps(out, allow_nan=False)


@pytest.mark.parametrize(("addr", "own", "url"), [
    ("9.9.9.9:8080", "1.1.1.1:9000", "http://9.9.9.9:8080/status?view=public"),
    ("peer.example.org:80", "1.1.1.1:9000", "http://peer.example.org:80/status?view=public"),
    ("[2606:4700::1111]:8080", "1.1.1.1:9000", "http://[2606:4700::1111]:8080/status?view=public"),
    ("127.0.0.1:8080", "127.0.0.1:9000", "http://127.0.0.1:8080/status?view=public"),
    ("10.0.0.5:8080", "10.0.0.1:9000", "http://10.0.0.5:8080/status?view=public"),
    ("127.0.0.1:8080", "1.1.1.1:9000", None),  # a public daemon probes no loopback for a viewer
    ("169.254.169.254:80", "1.1.1.1:9000", None),  # nor a link-local metadata service
    ("10.0.0.5:8080", "1.1.1.1:9000", None),  # nor its private network
    ("localhost:8080", "10.0.0.1:9000", None),
    ("9.9.9.9:8080/admin?x=", "1.1.1.1:9000", None),
    ("user@9.9.9.9:8080", "1.1.1.1:9000", None),
    ("9.9.9.9:0", "1.1.1.1:9000", None),
    ("9.9.9.9:99999", "1.1.1.1:9000", None),
    ("9.9.9.9", "1.1.1.1:9000", None),
    ("[::1]:8080", "1.1.1.1:9000", None),
    (7, "1.1.1.1:9000", None),
])
def test_a_status_is_fetched_only_from_a_plain_address_no_narrower_than_this_daemons(addr: object, own: str,
                                                                                     url: str | None) -> None:
    assert status_url(addr, own) == url
