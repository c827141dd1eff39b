"""``reach.verdict.classify``, the self-test's decision without I/O: one reached outvotes any number
of not-reached, private needs a quorum of well-formed not-reached answers, anything else keeps the
previous verdict."""

from __future__ import annotations

import pytest

from gossamer.peer.reach.verdict import PRIVATE_QUORUM, classify, quorum
from gossamer.peer.run.records import PRIVATE, PUBLIC, UNKNOWN

REACHED = {"http": True, "tcp": True, "observed": "203.0.113.7"}
NOT_REACHED = {"http": False, "tcp": False, "observed": "203.0.113.7", "why": "port closed"}
HALF = {"http": True, "tcp": False}


@pytest.mark.parametrize(("answers", "previous", "kind"), [
    ([REACHED, *[NOT_REACHED] * 7], UNKNOWN, PUBLIC),  # one reached is enough
    ([NOT_REACHED], PUBLIC, PUBLIC),  # one not-reached is no quorum
    ([NOT_REACHED, HALF], PUBLIC, PRIVATE),  # two distinct answerers, none reached both
    ([NOT_REACHED, {"http": "no", "tcp": False}, {"why": "x"}], UNKNOWN, UNKNOWN),  # malformed ones do not count
    ([], PRIVATE, PRIVATE),
])
def test_classify(answers: list[dict], previous: str, kind: str) -> None:
    assert classify(previous, asked=len(answers), answers=answers, needed=quorum(8)).kind == kind


def test_the_quorum_shrinks_only_to_who_could_be_asked() -> None:
    assert [quorum(n) for n in (0, 1, 2, 9)] == [1, 1, PRIVATE_QUORUM, PRIVATE_QUORUM]
    verdict = classify(UNKNOWN, asked=1, answers=[NOT_REACHED], needed=quorum(1))
    assert (verdict.kind, verdict.http, verdict.observed, verdict.why) == (PRIVATE, False, ("203.0.113.7",), ("port closed",))
