"""Who steers a learner: its median round (``out_of_step``) and the donors of a state it adopts
follow the learners whose pseudo-gradients it used lately (``Evidence``), else the tenured ones
(``run.tenure``); its inbox keeps room (``inbox_budget``) for the tenured ones. Identities that only
publish records, however many and however long, neither pull the median nor pick the state a
learner with contributors adopts, and fill at most half of its inbox."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping

CONTRIBUTION_KINDS = 2  # params and pseudo-gradients, each at most the model's size
EVIDENCE_ROUNDS = 16  # how many rounds a used pseudo-gradient keeps its sender among the contributors


class Evidence:
    """First-hand evidence of who is in step: the last round in which this learner used each
    peer's pseudo-gradient in its W2 mix (or adopted a state that peer served with a majority
    behind it). Only work the learner itself used counts, so no record can claim it; entries
    older than ``window_rounds`` are dropped, so it holds at most the peers of that many rounds."""

    def __init__(self, window_rounds: int = EVIDENCE_ROUNDS) -> None:
        self.window_rounds = window_rounds
        self._last: dict[str, int] = {}

    def saw(self, peers: Iterable[str], round: int) -> None:
        """``peers``' work of ``round`` was used."""
        for peer in peers:
            self._last[peer] = max(round, self._last.get(peer, round))

    def recent(self, round: int) -> dict[str, int]:
        """Peer -> the last round its work was used, for the peers used within the window before ``round``."""
        self._last = {p: r for p, r in self._last.items() if r >= round - self.window_rounds}
        return dict(self._last)


def claimed_rounds(records: Mapping[str, int], evidence: Mapping[str, int]) -> list[int]:
    """The rounds to take the median of: each peer's record round (peer -> round), but never
    below the last round this learner used its work in (a peer that sends this round's
    pseudo-gradients is at this round, whatever its record claims)."""
    return [max(round, evidence.get(peer, 0)) for peer, round in records.items()]


def inbox_budget(model_bytes: int, *, window_rounds: int, steering_learners: int) -> int:
    """Bytes an inbox may hold: twice what the steering learners (this one aside) can send in the
    inbox's window of rounds, so the half that new senders may fill never takes their room."""
    return 2 * CONTRIBUTION_KINDS * (window_rounds + 1) * max(steering_learners, 1) * model_bytes


def reach_rounds(catch_up_rounds: int) -> int:
    """Rounds ahead of its own that a learner's inbox keeps (and its pacing measures). The catch-up
    rule leaves alone every learner within ``catch_up_rounds - 1`` of the median round, so two it
    leaves alone can be ``2 (catch_up_rounds - 1)`` apart, and the one behind must keep what the one
    ahead sends for the rounds it has not reached yet, or it never uses any of it (three learners at
    rounds r, r + 1 and r + 3 with a window of 2: the first refused every contribution of the last,
    for good, and the e2e stalled-learner test waited for a round that used both others)."""
    return max(2, 2 * (catch_up_rounds - 1))


def out_of_step(mine: int, others: list[int], *, threshold: int) -> int | None:
    """The round to adopt when ``mine`` is ``threshold`` or more away from the median round of all
    the learners (this one included; the upper median, so a tie goes to the further-on half);
    None when in step or alone. One peer advertising a far-off round moves this median by at most
    one position."""
    if not others:
        return None
    median = statistics.median_high([mine, *others])
    return median if abs(median - mine) >= threshold else None
