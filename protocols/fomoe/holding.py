"""What an expert host holds, and how its experts change hands: taking the experts a placement
gives it (its own copy, or the state a source sent), handing the ones it is a source of to their
new holders at a round's boundary, the dense state it donates to joiners, and its part (dense
layers, routers, resident experts) written as a checkpoint at the end or on a clean shutdown.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from gossamer.protocols.fomoe.core import ExpertState, Placement
from gossamer.protocols.fomoe.core.boundary import Boundary
from gossamer.protocols.fomoe.ledger import RoundLedger
from gossamer.protocols.fomoe.wire import EXPERT, MOMENTUM, PARAM, experts_payload

if TYPE_CHECKING:
    from gossamer.protocols.fomoe.host import ExpertHostRole

log = logging.getLogger(__name__)
Part = tuple[int, dict[str, torch.Tensor], tuple[int, ...]]
"""(round, the dense part's and the resident experts' parameters, the resident experts)."""


class Holding:
    """The holding half of ``ExpertHostRole`` (see the module docstring)."""

    def _hold(self: ExpertHostRole, placement: Placement, states: Mapping[int, ExpertState], *,
              lost: tuple[int, ...]) -> None:
        """Hold what ``placement`` gives this peer: ``states`` for the experts that came from others,
        this peer's own copy for the rest of its new experts."""
        mine = placement.resident(self.peer_id)
        new = set(mine) - self.replica.resident
        self.replica.set_resident(mine, {e: states[e] if e in states else self._own_copy(e) for e in new})
        for expert in states:
            self.synced[expert] = self.replica.round
        self.placement = placement
        self.lost = lost
        self.emit("placement", round=self.replica.round, members=len(placement.peers), experts=list(mine),
                  holders=[len(h) for h in placement.holders], lost=list(lost))
        self.ctx.announce()

    def _own_copy(self: ExpertHostRole, expert: int) -> ExpertState:
        """This peer's copy of ``expert`` as it is (the weights it last synced, or the initial ones)."""
        if expert in self.replica.resident:
            return self.replica.expert_state(expert)
        layout = self.replica.layout
        names_ = {n for key in layout.units_of((expert,)) for n in layout.units[key]}
        params = {n: p.detach().clone() for n, p in self.replica.module.named_parameters() if n in names_}
        momentum = {n: u for n, u in self.replica.diloco.outer.state_dict().items() if n in names_}
        return ExpertState(expert, params, momentum)

    def _dense_state(self: ExpertHostRole) -> dict[str, torch.Tensor]:
        """What this peer donates to joiners at a round's start: the dense part and its momentum."""
        dense = set(self.replica.layout.dense)
        params = {PARAM + n: p.detach().clone() for n, p in self.replica.module.named_parameters() if n in dense}
        momentum = {MOMENTUM + n: u for n, u in self.replica.diloco.outer.state_dict().items() if n in dense}
        return {**params, **momentum}

    async def _move_experts(self: ExpertHostRole, boundary: Boundary, ledger: RoundLedger,
                            sending: list[asyncio.Task[None]]) -> None:
        """Hand the experts this peer is a source of to their new holders; take its own new ones."""
        me, round = self.peer_id, self.replica.round
        outgoing: dict[str, list[ExpertState]] = {}
        for move in boundary.outgoing(me):
            outgoing.setdefault(move.peer, []).append(self._own_copy(move.expert))
        if outgoing:
            payloads = {peer: experts_payload(states) for peer, states in outgoing.items()}
            sending.append(self._post(EXPERT, round, payloads, ledger, ledger.transfers))
        states = await self._take_experts(boundary, round, ledger)
        ledger.next_experts = list(boundary.placement.resident(me))
        ledger.lost = list(boundary.lost)
        self._hold(boundary.placement, states, lost=boundary.lost)

    async def _take_experts(self: ExpertHostRole, boundary: Boundary, round: int,
                            ledger: RoundLedger | None) -> dict[int, ExpertState]:
        """The states of this peer's new experts at ``round``'s start, each from the first of its
        sources that sent it (a member's transfers go into its ``ledger``; a joiner has none)."""
        incoming = boundary.incoming(self.peer_id)
        sources = sorted({s for move in incoming for s in move.sources})
        got = await self._collect(EXPERT, round, sources, self.settings.commit_deadline_s) if sources else {}
        states, used = {}, set()
        for move in incoming:
            source = next((s for s in move.sources if move.expert in got.get(s, {})), None)
            if source is None:
                log.warning("expert %d: none of its sources sent it; keeping this peer's copy", move.expert)
                if ledger is not None:
                    ledger.note += f" expert {move.expert}: no source sent it, kept this peer's copy;"
                continue
            states[move.expert] = got[source][move.expert]
            used.add(source)
        if ledger is not None:
            ledger.transfers.expect(sources)
            ledger.transfers.settle(got, refused=self.inbox.refused(EXPERT, round))
            ledger.transfers.use(used)
        return states

    def _part(self: ExpertHostRole) -> Part:
        """This host's part as it is now."""
        held = self.replica.layout.names_held(self.replica.resident)
        params = {n: p.detach().cpu().clone() for n, p in self.replica.module.named_parameters() if n in held}
        return self.replica.round, params, tuple(sorted(self.replica.resident))

    async def _write_part(self: ExpertHostRole, part: Part) -> str:
        round, params, experts = part
        name = f"{self.ctx.manifest.config.name}-{self.peer_id[:12]}-round{round}"
        path = await self.checkpoints.write_async(name, params, round=str(round), experts=",".join(map(str, experts)))
        return str(path)

    async def checkpoint(self: ExpertHostRole) -> str | None:
        """On a clean shutdown: write this host's part as it was at the start of the round under
        way, a state every holder of those experts had too. Returns None: nothing resumes from
        it (a host that starts again joins the swarm afresh and takes its part from the members);
        the file keeps the weights, e.g. when the whole swarm stops. A finished host already
        wrote its part."""
        if self.finished or self._boundary is None:
            return None
        self.checkpoint_path = await self._write_part(self._boundary)
        log.info("this host's part (dense layers, routers, experts %s) written to %s; started again, the host "
                 "joins afresh and takes its part from the members", list(self._boundary[2]), self.checkpoint_path)
        return None
