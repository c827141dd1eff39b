"""Role ``helper``: the second, independent server of TL++ secure mode (party 1).

The helper never talks to anyone's data and never sees a plaintext activation, gradient, label,
logit or loss. It takes from the data nodes of the run their share 1 of each tensor (``share``:
the cut activations of a step, then the step's gradients), and answers the orchestrator (the
manifest owner) with what is computed share-wise on them:

- ``logits`` {nodes, sizes} + the server weight W: its share of A W^T over the named nodes'
  activation shares, concatenated in sorted node order (``peer.tlpp_secure.server_logit_share``;
  the bias is party 0's to add). It waits up to ``helper_wait_s`` for shares still on their way
  and answers which nodes it used, leaving out a node whose share never came or does not match
  the size the orchestrator holds.
- ``sum`` {nodes}: the sum of its flat gradient shares over the named nodes (``server_sum``),
  waiting likewise and answering which nodes it summed (a node whose push failed is left out);
  only the orchestrator can add its own summed share and reconstruct the sum, never a single
  node's part.
- ``ping`` {nodes}: which of the named nodes the helper sees as live data nodes of the run,
  waiting up to ``helper_wait_s`` for those it does not see yet. The orchestrator asks before a
  node's first step with this helper: a node the helper cannot see could not push it a share.

It accepts share 1 (``party`` = 1) only, from live peers with the ``node`` role, each tensor once
per step, for at most ``MAX_STEPS_HELD`` steps; shares of steps before the orchestrator's latest
``logits`` request are refused and dropped. With ``--share_log`` it logs one line per
share tensor it accepts (``peer.roles.tlpp.wire``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import torch
from torch import nn

from gossamer.crypto.sharing import SharingError
from gossamer.peer.errors import ConfigError
from gossamer.peer.kit.secure_link import LinkMessage, RequestRefused, SecureLinkServer
from gossamer.peer.role import ProtocolRole, RoleContext, RoleHealth, TcpGate, TcpMethod
from gossamer.peer.roles.tlpp import names
from gossamer.peer.roles.tlpp.node import run_over
from gossamer.peer.roles.tlpp.secure import (
    HELPER,
    PartyShare,
    gradient_layout,
    layout_numel,
    server_logit_share,
    server_sum,
)
from gossamer.peer.roles.tlpp.settings import TlppSettings
from gossamer.peer.roles.tlpp.wire import (
    ACT,
    GRADS,
    HELPER_METHOD,
    LOGITS,
    PING,
    SHARE,
    SUM,
    ShareLog,
    check_party,
    check_tensors,
    flat_grads,
    node_list,
)
from gossamer.protocols.tlpp import TraversalError, affine_server

log = logging.getLogger(__name__)
MAX_STEPS_HELD = 8
KINDS = ("act", "grad")


class ShareStore:
    """Share tensors by step, node and kind until the orchestrator asks for them."""

    def __init__(self, *, max_steps: int = MAX_STEPS_HELD) -> None:
        self._shares: dict[int, dict[str, dict[str, dict[str, torch.Tensor]]]] = {}
        self._changed = asyncio.Condition()
        self._max_steps = max_steps
        self.floor = 0

    async def put(self, step: int, node: str, kind: str, tensors: dict[str, torch.Tensor]) -> None:
        if step < self.floor:
            raise RequestRefused(f"step {step} is over (the orchestrator is at step {self.floor})", code="stale")
        if step not in self._shares and len(self._shares) >= self._max_steps:
            raise RequestRefused(f"the helper already holds shares of {self._max_steps} steps", code="full")
        held = self._shares.setdefault(step, {}).setdefault(node, {})
        if kind in held:
            raise RequestRefused(f"node {node[:12]} already sent its {kind} shares of step {step}", code="duplicate")
        held[kind] = tensors
        async with self._changed:
            self._changed.notify_all()

    async def collect(self, step: int, nodes: list[str], kind: str, *, timeout_s: float) -> dict[str, dict]:
        """The named nodes' ``kind`` shares of ``step``, waiting up to ``timeout_s`` for missing ones."""
        def present() -> dict[str, dict]:
            held = self._shares.get(step, {})
            return {n: held[n][kind] for n in nodes if kind in held.get(n, {})}

        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: len(present()) == len(nodes)), timeout_s)
            except TimeoutError:
                pass
        return present()

    def advance(self, step: int) -> None:
        """The orchestrator is at ``step``: drop everything older and refuse it from now on."""
        self.floor = max(self.floor, step)
        for old in [s for s in self._shares if s < self.floor]:
            del self._shares[old]

    def discard(self, step: int) -> None:
        self._shares.pop(step, None)

    @property
    def steps_held(self) -> int:
        return len(self._shares)


class TlppHelperRole(ProtocolRole[TlppSettings]):
    """The TL++ helper (see the module docstring)."""

    name = names.HELPER

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        if not self.settings.secure:
            raise ConfigError(f"run {ctx.manifest.run_id} trains in base mode; a helper only takes part in secure mode "
                              "(hyper.mode = \"secure\")")
        model = self.settings.build_model("cpu")
        node_side, server_side = self.settings.split(model)
        try:
            served = affine_server(server_side)
        except TraversalError as exc:
            raise ConfigError(f"secure mode: {exc}") from exc
        parameter_names = {id(p): name for name, p in model.named_parameters()}
        self.weight_name = parameter_names[id(served.weight)]
        self._linear = nn.Linear(served.in_features, served.out_features, bias=False)
        self._grads = flat_grads(layout_numel(gradient_layout(node_side, server_side)))
        self.store = ShareStore()
        self.share_log = ShareLog(ctx.config.share_log or None)
        self._server = SecureLinkServer(identity=ctx.identity, run_id=ctx.manifest.run_id, method=HELPER_METHOD,
                                        authorize=self._authorize, handler=self._handle, traffic=ctx.traffic)
        self.shares_received = 0
        self.logits_served = 0
        self.sums_served = 0
        self.last_step = -1

    # -- role interface -------------------------------------------------------------------------

    def tcp_methods(self) -> dict[str, TcpMethod]:
        return self._server.tcp_methods()

    def tcp_gates(self) -> dict[str, TcpGate]:
        return self._server.tcp_gates()

    @property
    def round(self) -> int:
        return max(0, self.last_step + 1)

    def status(self) -> dict[str, Any]:
        return {"mode": self.settings.mode, "shares_received": self.shares_received,
                "logits_served": self.logits_served, "sums_served": self.sums_served, "last_step": self.last_step,
                "steps_held": self.store.steps_held}

    def health(self) -> RoleHealth:
        return run_over(self, super().health())

    # -- requests -------------------------------------------------------------------------------

    def _authorize(self, peer_id: str) -> bytes:
        if peer_id == self.ctx.manifest.owner_peer_id:
            return self.ctx.manifest.owner_public_key
        live = self.live_with(peer_id, names.NODE)
        if live is None:
            raise RequestRefused(f"peer {peer_id[:12]} is neither this run's orchestrator nor a live data node")
        return live.record.public_key

    async def _handle(self, peer_id: str, message: LinkMessage) -> LinkMessage:
        from_orchestrator = peer_id == self.ctx.manifest.owner_peer_id
        if message.op == SHARE and not from_orchestrator:
            return await self._share(peer_id, message)
        if message.op in (LOGITS, SUM, PING) and from_orchestrator:
            self.last_step = max(self.last_step, message.step)
            if message.op == PING:
                return await self._ping(message)
            return await (self._logits(message) if message.op == LOGITS else self._sum(message))
        raise RequestRefused(f"the helper does not take {message.op!r} from peer {peer_id[:12]}")

    async def _share(self, node: str, message: LinkMessage) -> LinkMessage:
        check_party(message.fields, HELPER, what=f"shares from node {node[:12]}")
        kind = message.fields.get("kind")
        if kind == "act":
            tensors = message.tensors
            act = tensors.get(ACT)
            if set(tensors) != {ACT} or act.dtype != torch.int64 or act.dim() != 2 \
                    or act.shape[1] != self._linear.in_features:
                raise RequestRefused(f"activation shares must be one int64 tensor [rows, {self._linear.in_features}]",
                                     code="malformed")
            logged = [ACT]
        elif kind == "grad":
            check_tensors(message.tensors, self._grads, what="gradient shares")
            logged = [GRADS]
        else:
            raise RequestRefused(f"share kind must be one of {KINDS}, got {kind!r}", code="malformed")
        await self.store.put(message.step, node, kind, message.tensors)
        self.shares_received += len(logged)
        self.share_log.record(step=message.step, node=node, tensors=logged, share_index=HELPER)
        return LinkMessage(SHARE, message.step)

    async def _ping(self, message: LinkMessage) -> LinkMessage:
        nodes = node_list(message.fields.get("nodes"), "ping: nodes")

        def seen() -> list[str]:
            return [n for n in nodes if self.live_with(n, names.NODE) is not None]

        await self.ctx.until_view(lambda: len(seen()) == len(nodes), timeout_s=self.settings.helper_wait_s)
        return LinkMessage(PING, message.step, {"nodes": seen()})

    async def _logits(self, message: LinkMessage) -> LinkMessage:
        nodes = node_list(message.fields.get("nodes"), "logits: nodes")
        sizes = message.fields.get("sizes")
        if not isinstance(sizes, dict) or set(sizes) != set(nodes):
            raise RequestRefused("logits: sizes must give each named node's row count", code="malformed")
        check_tensors(message.tensors, {"weight": self._linear.weight}, what="logits: server weight")
        self.store.advance(message.step)
        shares = await self.store.collect(message.step, nodes, "act", timeout_s=self.settings.helper_wait_s)
        used = [n for n in nodes if n in shares and shares[n][ACT].shape[0] == sizes[n]]
        if not used:
            return LinkMessage(LOGITS, message.step, {"nodes": []})
        with torch.no_grad():
            self._linear.weight.copy_(message.tensors["weight"])
        try:
            share = await asyncio.to_thread(server_logit_share, {n: PartyShare(HELPER, shares[n][ACT]) for n in used},
                                            self._linear, max_abs=self.settings.max_abs,
                                            max_failure=self.settings.max_failure)
        except SharingError as exc:
            raise RequestRefused(str(exc), code="guard") from exc
        self.logits_served += 1
        return LinkMessage(LOGITS, message.step, {"nodes": used}, {"logits": share.ring})

    async def _sum(self, message: LinkMessage) -> LinkMessage:
        nodes = node_list(message.fields.get("nodes"), "sum: nodes")
        shares = await self.store.collect(message.step, nodes, "grad", timeout_s=self.settings.helper_wait_s)
        used = [n for n in nodes if n in shares]
        if not used:
            self.store.discard(message.step)
            return LinkMessage(SUM, message.step, {"nodes": []})
        summed = server_sum([PartyShare(HELPER, shares[n][GRADS]) for n in used])
        self.store.discard(message.step)
        self.sums_served += 1
        return LinkMessage(SUM, message.step, {"nodes": used}, {GRADS: summed.ring})
