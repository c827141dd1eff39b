"""One FoMoE peer's replica: a ``DilocoReplica`` over the MoE model that runs, trains and steps
only its resident experts; holders of an expert stay bit-identical because a new holder takes the
expert's weights and outer momentum from one of them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import torch

from gossamer.protocols.core.errors import ProtocolError
from gossamer.protocols.core.models import next_byte_loss
from gossamer.protocols.core.text_data import evaluate
from gossamer.protocols.diloco.core.replica import DilocoConfig, DilocoReplica, Params
from gossamer.protocols.fomoe.core.config import FomoeConfig
from gossamer.protocols.fomoe.core.layout import ParamLayout
from gossamer.protocols.fomoe.core.model import MoETransformer, Routing
from gossamer.protocols.fomoe.core.sync import FomoeUpdate, MixedRound


@dataclass(frozen=True)
class StepReport:
    """One inner step: the loss the optimizer saw, its parts, and what was routed."""

    loss: float
    cross_entropy: float
    aux_loss: float
    routed_pairs: int
    computed_pairs: int

    @property
    def skip_fraction(self) -> float:
        return 1.0 - self.computed_pairs / self.routed_pairs if self.routed_pairs else 0.0


@dataclass(frozen=True, eq=False)
class ExpertState:
    """Expert e as its holder has it between rounds: parameters and outer momentum, all blocks."""

    expert: int
    params: Params
    momentum: Params


class _Resident(torch.nn.Module):
    """The model as one peer runs it: only its resident experts (what ``evaluate`` calls)."""

    def __init__(self, module: MoETransformer, resident: Collection[int]) -> None:
        super().__init__()
        self.module = module
        self.resident = tuple(sorted(resident))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.module(tokens, resident=self.resident)


class FomoeReplica:
    """``sender`` (this peer's id), its MoE model, the experts it holds and the DiLoCo machinery.
    A round::

        begin_round() -> inner_step(x, y) x H -> end_inner() -> FomoeUpdate
            ... the network moves updates; each peer calls mix_round for what it holds ...
        finish_round(mixed)

    ``finish_round`` freezes the experts it does not hold and the idle units; ``set_resident``
    takes a new resident set between rounds, each new expert's state from one of its holders
    (``expert_state`` there, ``adopt_expert`` here)."""

    def __init__(self, sender: str, module: MoETransformer, resident: Collection[int], *,
                 diloco: DilocoConfig | None = None, fomoe: FomoeConfig | None = None) -> None:
        self.sender = sender
        self.module = module
        self.layout = ParamLayout.of(module)
        self.config = fomoe if fomoe is not None else FomoeConfig()
        self.diloco = DilocoReplica(module, diloco)
        module.resident_mask(resident, device="cpu")  # refuses bad indices now
        self.resident = frozenset(resident)
        self._tokens = torch.zeros(self.layout.n_layers, self.layout.n_experts, dtype=torch.int64)

    @property
    def round(self) -> int:
        return self.diloco.round

    def begin_round(self) -> Params:
        self._tokens.zero_()
        return self.diloco.begin_round()

    def inner_step(self, x: torch.Tensor, y: torch.Tensor) -> StepReport:
        """One AdamW step on the batch, running only the resident experts."""
        parts: dict[str, torch.Tensor | Routing] = {}

        def compute(module: torch.nn.Module) -> torch.Tensor:
            logits, routing = module.forward_routed(x, resident=self.resident,
                                                    renormalize=self.config.renormalize_skipped)
            parts["ce"], parts["routing"] = next_byte_loss(logits, y), routing
            return parts["ce"] + self.config.aux_loss_weight * routing.aux_loss

        loss = self.diloco.inner_step(compute)
        routing = parts["routing"]
        assert isinstance(routing, Routing)
        self._tokens += routing.computed.cpu()
        return StepReport(loss, float(parts["ce"].detach()), float(routing.aux_loss.detach()),
                          int(routing.routed.sum()), int(routing.computed.sum()))

    def end_inner(self) -> FomoeUpdate:
        """The update to send: pseudo-gradients of what this peer holds, and its pair counts."""
        d = self.diloco.end_inner()
        held = self.layout.names_held(self.resident)
        return FomoeUpdate(self.sender, {name: d[name] for name in sorted(held)}, self._tokens.clone())

    def finish_round(self, mixed: MixedRound) -> None:
        """The outer step on the dense aggregate and on each held unit's aggregate; units this
        peer does not hold, and idle ones, keep their weights. ``mixed`` must cover every held
        unit (as aggregate or idle)."""
        held_units = self.layout.units_of(self.resident)
        uncovered = sorted(set(held_units) - set(mixed.experts) - set(mixed.idle))
        if uncovered:
            raise ProtocolError(f"finish_round: no aggregate and not idle for held units {uncovered}")
        stepped = dict(mixed.dense)
        for key in held_units:
            if key in mixed.experts:
                stepped.update(mixed.experts[key])
        x = self.diloco.snapshot
        frozen = self.layout.size_bytes.keys() - stepped.keys()
        self.diloco.finish_round({name: x[name] for name in stepped}, stepped, frozen=frozen)

    def expert_state(self, expert: int) -> ExpertState:
        """What a new holder of ``expert`` fetches from this one (between rounds)."""
        if expert not in self.resident:
            raise ProtocolError(f"expert_state: peer {self.sender} does not hold expert {expert}")
        names = [n for key in self.layout.units_of((expert,)) for n in self.layout.units[key]]
        params = self.diloco.parameters_snapshot()
        momentum = self.diloco.outer.state_dict()
        return ExpertState(expert, {n: params[n] for n in names}, {n: momentum[n] for n in names if n in momentum})

    def set_resident(self, resident: Collection[int], states: Mapping[int, ExpertState]) -> None:
        """Hold ``resident`` from now on (between rounds); ``states`` gives every newly held expert
        as its holder has it. An expert that was lost (no live holder) may be passed with this
        peer's own stale copy (``expert_state`` is refused for it; build the ExpertState from
        the run's last checkpoint, or from ``module``'s parameters with empty momentum)."""
        if self.diloco.phase != "idle":
            raise ProtocolError(f"set_resident: only between rounds, replica is in {self.diloco.phase!r}")
        self.module.resident_mask(resident, device="cpu")
        new = set(resident) - self.resident
        missing = sorted(new - set(states))
        if missing:
            raise ProtocolError(f"set_resident: no state given for newly held experts {missing}")
        for expert in sorted(new):
            self.adopt_expert(states[expert])
        self.resident = frozenset(resident)

    def heldout_loss(self, heldout: torch.Tensor, *, context: int, max_batches: int,
                     device: torch.device | str) -> float:
        """Mean next-byte loss on ``heldout`` with only this peer's experts run (as it trains)."""
        return evaluate(_Resident(self.module, self.resident), heldout, context=context, max_batches=max_batches,
                        device=device)

    @torch.no_grad()
    def adopt_expert(self, state: ExpertState) -> None:
        """Load one expert's parameters and outer momentum; its inner AdamW state is reset."""
        names = {n for key in self.layout.units_of((state.expert,)) for n in self.layout.units[key]}
        if state.params.keys() != names or not state.momentum.keys() <= names:
            raise ProtocolError(f"adopt_expert: expert {state.expert} parameters differ in "
                                f"{sorted(set(state.params) ^ names)}")
        own = dict(self.module.named_parameters())
        for name in names:
            if tuple(state.params[name].shape) != tuple(own[name].shape):
                raise ProtocolError(f"adopt_expert: {name} has shape {tuple(state.params[name].shape)}")
        for name in names:
            own[name].copy_(state.params[name])
            self.diloco.inner_optimizer.state.pop(own[name], None)
        momentum = self.diloco.outer.state_dict()
        for name in names:
            momentum.pop(name, None)
        momentum.update({n: u.to(own[n].device) for n, u in state.momentum.items()})
        self.diloco.outer.load_state_dict(momentum)
