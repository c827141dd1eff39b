"""Who steers a learner: its median round (``out_of_step``), the donors of a state it adopts and the
room its inbox keeps (``inbox_budget``) follow the learners that may steer it (the tenured ones, or
all when none is: ``ProtocolRole.steering_peers_with``). New identities, however many, can neither
pull the median nor offer the state a learner adopts, and fill at most half of its inbox."""

from __future__ import annotations

import statistics

CONTRIBUTION_KINDS = 2  # params and pseudo-gradients, each at most the model's size


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
