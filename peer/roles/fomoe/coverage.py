"""Expert coverage, as ``/status`` and ``gossamer status`` show it: each expert's holders, the
pairs (tokens routed to it) its holders ran in the last round, and whether it is lost.

An expert is flagged when no live peer holds it (it keeps its last synced weights wherever they
are), and when the last re-placement found none of its holders among the agreed members (it was
restarted from the freshest copy a member had).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gossamer.peer.roles.fomoe import names
from gossamer.peer.run.records import PeerRecord
from gossamer.protocols.errors import InvalidSetting
from gossamer.protocols.fomoe import Placement, coverage, from_assignments


def expert_coverage(placement: Placement, tokens: Sequence[int], lost: Sequence[int]) -> list[dict[str, Any]]:
    """One row per expert of this peer's placement (for ``/status``)."""
    return [{"expert": c.expert, "holders": [h[:12] for h in c.holders], "tokens": c.tokens,
             "lost": c.expert in lost, "no_live_holder": not c.holders}
            for c in coverage(placement, tokens)]


def _ints(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return value
    return None


def summarize(records: Sequence[PeerRecord]) -> list[str]:
    """``gossamer status``'s lines about a FoMoE run: the coverage the live hosts' records show."""
    hosts = [r for r in records if names.EXPERT_HOST in r.roles]
    members = [r for r in hosts if isinstance(r.assignment.get("members"), int) and r.assignment["members"] > 0]
    if not members:
        return [f"experts: {len(hosts)} expert host(s) live, none in a placement yet"]
    newest = max(members, key=lambda r: (r.round, r.peer_id))
    n_experts, replication = newest.assignment.get("n_experts"), newest.assignment.get("replication")
    tokens = _ints(newest.assignment.get("tokens")) or []
    lost = set(_ints(newest.assignment.get("lost")) or [])
    try:
        placement = from_assignments({r.peer_id: _ints(r.assignment.get("experts")) or [] for r in members},
                                     n_experts=n_experts, replication=replication, round=newest.round)
        rows = coverage(placement, tokens if len(tokens) == n_experts else None)
    except InvalidSetting as exc:
        return [f"experts: the hosts' records do not describe one placement ({exc})"]
    lines = [f"experts: {n_experts} expert(s), r = {replication}, {len(members)} member(s) "
             f"(round {newest.round}); pairs run in the last round as {newest.peer_id[:12]} reports them",
             f"{'EXPERT':<8}{'HOLDERS':<44}{'PAIRS':>10}  FLAG"]
    for row in rows:
        holders = ",".join(h[:12] for h in row.holders) or "-"
        flag = "NO LIVE HOLDER: keeps its last synced weights" if not row.holders else (
            "lost at the last re-placement: restarted from the freshest copy" if row.expert in lost else "")
        lines.append(f"{row.expert:<8}{holders[:43]:<44}{row.tokens:>10}  {flag}".rstrip())
    return lines
