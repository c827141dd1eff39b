"""Opening ring frames: a stranger's well-signed frames are refused as "sender" before the replay
guard remembers their nonces, so keys that are not in the run cannot fill it; a member's frame is
remembered and its replay refused."""

from __future__ import annotations

import pytest

from gossamer.crypto.envelope import ReplayGuard, ReplayGuardConfig
from gossamer.crypto.identity import Identity
from gossamer.protocols.context.wire import ABORT, FrameRefused, frame_for, new_attempt, open_frame, outbound

RUN = "ctx@00112233aabbccdd"
NOW = 1_700_000_000.0


def test_strangers_cannot_fill_the_replay_guard() -> None:
    me, member = Identity.generate(), Identity.generate()
    guard = ReplayGuard(ReplayGuardConfig(max_entries=4), started_at=NOW)

    def opened(sender: Identity):
        frame = frame_for(outbound(ABORT, 0, {"attempt": new_attempt(), "reason": "x", "suspect": None}), sender,
                          recipient=me.peer_id, run_id=RUN, now=NOW)
        return frame, lambda: open_frame(frame, guard=guard, me=me.peer_id, run_id=RUN, now=NOW, max_payload=0,
                                         sender_ok=lambda peer_id, key: key == member.public_key)

    for _ in range(10):
        _, attempt = opened(Identity.generate())
        with pytest.raises(FrameRefused) as refused:
            attempt()
        assert refused.value.code == "sender"
    assert len(guard) == 0

    _, attempt = opened(member)
    assert attempt().sender == member.peer_id and len(guard) == 1
    with pytest.raises(FrameRefused) as replayed:
        attempt()
    assert replayed.value.code == "envelope"
