"""Expert coverage as ``/status``, ``gossamer status`` and the swarm page show it: each expert's
holders, the pairs they ran in the last round, and its flags (no live holder; lost at the last
re-placement), from the newest placement the live hosts' records show.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gossamer.peer.plugin import Panel
from gossamer.peer.run.records import PeerRecord
from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.fomoe import names
from gossamer.protocols.fomoe.core import Placement, coverage, from_assignments


def expert_coverage(placement: Placement, tokens: Sequence[int], lost: Sequence[int]) -> list[dict[str, Any]]:
    """One row per expert of this peer's placement (for ``/status``)."""
    return [{"expert": c.expert, "holders": [h[:12] for h in c.holders], "tokens": c.tokens,
             "lost": c.expert in lost, "no_live_holder": not c.holders}
            for c in coverage(placement, tokens)]


def _ints(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return value
    return None


def coverage_table(records: Sequence[PeerRecord]) -> tuple[str, list[list[Any]]] | str:
    """From the live hosts' records: a heading and one row per expert (expert, holders, pairs run
    in the last round, flag), or one line saying why there is no table yet."""
    hosts = [r for r in records if names.EXPERT_HOST in r.roles]
    members = [r for r in hosts if isinstance(r.assignment.get("members"), int) and r.assignment["members"] > 0]
    if not members:
        return f"experts: {len(hosts)} expert host(s) live, none in a placement yet"
    newest = max(members, key=lambda r: (r.round, r.peer_id))
    members = [r for r in members if r.assignment.get("placement_round") == newest.assignment.get("placement_round")]
    n_experts, replication = newest.assignment.get("n_experts"), newest.assignment.get("replication")
    tokens = _ints(newest.assignment.get("tokens")) or []
    lost = set(_ints(newest.assignment.get("lost")) or [])
    try:
        placement = from_assignments({r.peer_id: _ints(r.assignment.get("experts")) or [] for r in members},
                                     n_experts=n_experts, replication=replication, round=newest.round)
        rows = coverage(placement, tokens if len(tokens) == n_experts else None)
    except InvalidSetting as exc:
        return f"experts: the hosts' records do not describe one placement ({exc})"
    heading = (f"experts: {n_experts} expert(s), r = {replication}, {len(members)} member(s) "
               f"(round {newest.round}); pairs run in the last round as {newest.peer_id[:12]} reports them")
    table = []
    for row in rows:
        flag = "NO LIVE HOLDER: keeps its last synced weights" if not row.holders else (
            "lost at the last re-placement: restarted from the freshest copy" if row.expert in lost else "")
        table.append([row.expert, [h[:12] for h in row.holders], row.tokens, flag])
    return heading, table


def summarize(records: Sequence[PeerRecord]) -> list[str]:
    """``gossamer status``'s lines about a FoMoE run: the coverage the live hosts' records show."""
    table = coverage_table(records)
    if isinstance(table, str):
        return [table]
    heading, rows = table
    lines = [heading, f"{'EXPERT':<8}{'HOLDERS':<44}{'PAIRS':>10}  FLAG"]
    for expert, holders, tokens, flag in rows:
        shown = ",".join(holders) or "-"
        lines.append(f"{expert:<8}{shown[:43]:<44}{tokens:>10}  {flag}".rstrip())
    return lines


def panel(records: Sequence[PeerRecord]) -> Panel | None:
    """The swarm page's expert coverage table (None before any placement)."""
    table = coverage_table(records)
    if isinstance(table, str):
        return None
    _heading, rows = table
    return Panel(title="expert coverage", columns=("expert", "holders", "pairs last round", "flag"),
                 rows=[[expert, ", ".join(holders) or "-", tokens, flag or "-"] for expert, holders, tokens, flag in rows])
