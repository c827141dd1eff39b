"""Role ``helper``: secure mode's second, independent party (party 1), run by another operator.
It takes the data nodes' share 1 of each tensor and answers the orchestrator with what is computed
share-wise on them (``logits``, ``sum``, ``ping``); it never sees a plaintext activation, gradient,
label, logit or loss. Its requests and checks are in ``protocols/tlpp/README.md``."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import torch
from torch import nn

from gossamer.crypto.sharing import SharingError
from gossamer.peer.errors import ConfigError
from gossamer.peer.kit.conditions import wait_until
from gossamer.peer.kit.secure_link import LinkMessage, RequestRefused, SecureLinkServer
from gossamer.peer.role import ProtocolRole, RoleContext, RoleHealth, TcpGate, TcpMethod
from gossamer.protocols.tlpp import names
from gossamer.protocols.tlpp.core import TraversalError, affine_layer
from gossamer.protocols.tlpp.core.secure import (
    HELPER,
    PartyShare,
    gradient_layout,
    layout_numel,
    party_logit_share,
    party_sum,
)
from gossamer.protocols.tlpp.node import run_over
from gossamer.protocols.tlpp.settings import TlppSettings, check_secure_admission
from gossamer.protocols.tlpp.wire import (
    ACT,
    GRADS,
    HELPER_METHOD,
    LOGITS,
    PING,
    SHARE,
    SHARE_WINDOW,
    SUM,
    ShareLog,
    check_party,
    check_tensors,
    flat_grads,
    node_list,
)

log = logging.getLogger(__name__)
KINDS = ("act", "grad")


class ShareStore:
    """Share tensors by step, node and kind until the orchestrator asks for them; only for steps in
    the window ``floor .. floor + window`` (``floor``: the step the orchestrator announced last), so
    each node holds at most ``window + 1`` steps of its own and none can crowd out another's."""

    def __init__(self, *, window: int = SHARE_WINDOW) -> None:
        self._shares: dict[int, dict[str, dict[str, dict[str, torch.Tensor]]]] = {}
        self._logits: dict[int, dict[str, int]] = {}  # step -> the nodes its logits used, and their rows
        self._changed = asyncio.Condition()
        self._window = window
        self.floor = 0

    async def put(self, step: int, node: str, kind: str, tensors: dict[str, torch.Tensor]) -> None:
        if step < self.floor:
            raise RequestRefused(f"step {step} is over (the orchestrator is at step {self.floor})", code="stale")
        if step > self.floor + self._window:
            raise RequestRefused(f"step {step} is ahead of the window: the orchestrator is at step {self.floor}, the "
                                 f"helper takes shares of steps {self.floor}..{self.floor + self._window}", code="ahead")
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

        await wait_until(self._changed, lambda: len(present()) == len(nodes), timeout_s=timeout_s)
        return present()

    def announce(self, step: int) -> None:
        """The orchestrator is at ``step``: drop everything older and refuse it from now on."""
        self.floor = max(self.floor, step)
        for old in [s for s in self._shares if s < self.floor]:
            del self._shares[old]
        for old in [s for s in self._logits if s < self.floor]:
            del self._logits[old]

    def open_logits(self, step: int) -> None:
        """``logits`` of ``step`` is asked: refused if it was asked before (once per step)."""
        if step in self._logits:
            raise RequestRefused(f"logits of step {step} were already asked; the helper answers them once",
                                 code="repeat")
        self._logits[step] = {}

    def logits_used(self, step: int, rows: dict[str, int]) -> None:
        self._logits[step] = rows

    def logit_rows(self, step: int) -> dict[str, int]:
        """The nodes (and their rows) the logits of ``step`` used; RequestRefused if none were asked."""
        if step not in self._logits:
            raise RequestRefused(f"sum of step {step}: the helper answered no logits of that step (or summed it "
                                 "already)", code="nodes")
        return self._logits[step]

    def discard(self, step: int) -> None:
        self._shares.pop(step, None)
        self._logits.pop(step, None)

    @property
    def steps_held(self) -> int:
        return len(self._shares)


class TlppHelperRole(ProtocolRole[TlppSettings]):
    """The TL++ helper (``protocols/tlpp/README.md``, "Roles")."""

    name = names.HELPER

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        if not self.settings.secure:
            raise ConfigError(f"run {ctx.manifest.run_id} trains in base mode; a helper only takes part in secure mode "
                              "(hyper.mode = \"secure\")")
        check_secure_admission(self.settings, ctx.manifest.config.policy)
        if ctx.identity.peer_id != self.settings.helper:
            raise ConfigError(f"run {ctx.manifest.run_id} pins helper {self.settings.helper[:16]}... (hyper.helper); "
                              f"this identity is {ctx.identity.peer_id[:16]}...: a helper runs only as the one the "
                              "run names")
        model = self.settings.build_model("cpu")
        node_side, orchestrator_side = self.settings.split(model)
        try:
            served = affine_layer(orchestrator_side)
        except TraversalError as exc:
            raise ConfigError(f"secure mode: {exc}") from exc
        parameter_names = {id(p): name for name, p in model.named_parameters()}
        self.weight_name = parameter_names[id(served.weight)]
        self._linear = nn.Linear(served.in_features, served.out_features, bias=False)
        self._grads = flat_grads(layout_numel(gradient_layout(node_side, orchestrator_side)))
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
            self.store.announce(message.step)
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
            if act.shape[0] > self.settings.batch_size:
                raise RequestRefused(f"activation shares of {act.shape[0]} rows; a step has at most batch_size = "
                                     f"{self.settings.batch_size}", code="malformed")
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
        await self.ctx.fault_point("logits", message.step)  # a test's crash or stall before its step's first answer
        nodes = node_list(message.fields.get("nodes"), "logits: nodes")
        sizes = message.fields.get("sizes")
        if not isinstance(sizes, dict) or set(sizes) != set(nodes) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in sizes.values()):
            raise RequestRefused("logits: sizes must give each named node's row count", code="malformed")
        check_tensors(message.tensors, {"weight": self._linear.weight}, what="logits: the affine layer's weight")
        self._check_enough(nodes, sizes, what="logits")
        self.store.open_logits(message.step)
        shares = await self.store.collect(message.step, nodes, "act", timeout_s=self.settings.helper_wait_s)
        used = [n for n in nodes if n in shares and shares[n][ACT].shape[0] == sizes[n]]
        short = self.settings.too_few(used, sizes) if used else ""
        if not used or short:  # which nodes it holds, but no share
            return LinkMessage(LOGITS, message.step, {"nodes": used, **({"note": short} if short else {})})
        self.store.logits_used(message.step, {n: sizes[n] for n in used})
        with torch.no_grad():
            self._linear.weight.copy_(message.tensors["weight"])
        try:
            share = await asyncio.to_thread(party_logit_share, {n: PartyShare(HELPER, shares[n][ACT]) for n in used},
                                            self._linear, max_abs=self.settings.max_abs,
                                            max_failure=self.settings.max_failure)
        except SharingError as exc:
            raise RequestRefused(str(exc), code="guard") from exc
        self.logits_served += 1
        return LinkMessage(LOGITS, message.step, {"nodes": used}, {"logits": share.ring})

    def _check_enough(self, nodes: list[str], rows: dict[str, int], *, what: str) -> None:
        """RequestRefused for a request that could never reveal enough: fewer than k nodes or
        ``min_batch`` samples (the orchestrator never sends one; one that does is not followed)."""
        short = self.settings.too_few(nodes, rows)
        if short:
            raise RequestRefused(f"{what}: {short}; nothing over them is revealed", code="nodes")

    async def _sum(self, message: LinkMessage) -> LinkMessage:
        await self.ctx.fault_point("sum", message.step)  # a test's crash mid-send: logits answered, not the sum
        nodes = node_list(message.fields.get("nodes"), "sum: nodes")
        rows = self.store.logit_rows(message.step)
        if not set(nodes) <= set(rows):
            raise RequestRefused(f"sum of step {message.step}: nodes {sorted(n[:12] for n in set(nodes) - set(rows))} "
                                 "were not in that step's logits", code="nodes")
        self._check_enough(nodes, rows, what=f"sum of step {message.step}")
        shares = await self.store.collect(message.step, nodes, "grad", timeout_s=self.settings.helper_wait_s)
        used = [n for n in nodes if n in shares]
        self.store.discard(message.step)
        short = self.settings.too_few(used, rows) if used else ""
        if not used or short:  # which nodes it holds, but no share
            return LinkMessage(SUM, message.step, {"nodes": used, **({"note": short} if short else {})})
        summed = party_sum([PartyShare(HELPER, shares[n][GRADS]) for n in used])
        await self.ctx.fault_point("aggregate", message.step)  # a test's crash: summed, never answered
        self.sums_served += 1
        return LinkMessage(SUM, message.step, {"nodes": used}, {GRADS: summed.ring})
