"""DiLoCo on one learner: its config, the inner AdamW phase, pseudo-gradients, and the outer
Nesterov step. A ``DilocoReplica`` is a state machine (idle -> inner -> outer -> idle, one outer
round) over ``Params`` (named tensors, on the module's device); only m, d~ and u~ come from the
others, and the inner AdamW state is kept across rounds."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gossamer.protocols.core.errors import InvalidSetting, ProtocolError
from gossamer.protocols.core.settings import check, setting

Params = dict[str, torch.Tensor]


@dataclass(frozen=True, kw_only=True)
class DilocoConfig:
    """Hyperparameters of one DiLoCo learner (the run manifest's ``[hyper.diloco]`` table)."""

    inner_steps: int = setting(50, low=1, doc="H: inner AdamW steps per outer round")
    inner_lr: float = setting(1e-3, above=0.0, doc="inner AdamW learning rate")
    inner_weight_decay: float = setting(0.1, low=0.0, doc="inner AdamW decoupled weight decay")
    inner_betas: tuple[float, float] = setting((0.9, 0.95), doc="inner AdamW (beta1, beta2), each in [0, 1)")
    grad_clip: float = setting(1.0, low=0.0, doc="largest global gradient norm of an inner step; 0: no clipping")
    outer_lr: float = setting(0.7, above=0.0, doc="eta: outer learning rate")
    outer_momentum: float = setting(0.9, low=0.0, below=1.0, doc="mu: outer momentum")
    nesterov: bool = setting(True, doc="a Nesterov outer step (true) or plain heavy-ball momentum (false)")

    def __post_init__(self) -> None:
        check(self)
        if not all(0.0 <= beta < 1.0 for beta in self.inner_betas):
            raise InvalidSetting(f"inner_betas must each be >= 0 and < 1, got {self.inner_betas!r}")


def pseudo_gradient(x: Params, y: Params) -> Params:
    """d = x - y: x are the parameters at the start of the inner phase, y after the H inner steps."""
    if x.keys() != y.keys():
        raise ProtocolError(f"pseudo_gradient: parameter names differ: {sorted(set(x) ^ set(y))}")
    return {name: x[name] - y[name] for name in x}


class OuterNesterov:
    """The outer optimizer with a momentum buffer u per replica (zero before the first step).

    ``step(m, d)`` computes u = mu u + d and returns m - eta (d + mu u) (Nesterov) or m - eta u.
    ``step(m, d, u_mixed)`` starts from the mixed momentum u~ instead of its own: u = mu u~ + d.
    """

    def __init__(self, *, lr: float, momentum: float, nesterov: bool = True) -> None:
        self.lr = lr
        self.momentum = momentum
        self.nesterov = nesterov
        self._u: Params = {}

    @classmethod
    def from_config(cls, config: DilocoConfig) -> OuterNesterov:
        return cls(lr=config.outer_lr, momentum=config.outer_momentum, nesterov=config.nesterov)

    @torch.no_grad()
    def step(self, m: Params, d_mixed: Params, u_mixed: Params | None = None) -> Params:
        """One outer step from the mixed parameters ``m`` with the mixed pseudo-gradient ``d_mixed``,
        from the mixed momentum ``u_mixed`` when given (it replaces this replica's own buffer)."""
        for label, given in (("d_mixed", d_mixed), ("u_mixed", u_mixed)):
            if given is not None and m.keys() != given.keys():
                raise ProtocolError(f"outer step: m and {label} cover different names: {sorted(set(m) ^ set(given))}")
        mu, lr = self.momentum, self.lr
        previous = self._u if u_mixed is None else u_mixed
        out: Params = {}
        for name, d in d_mixed.items():
            u = previous.get(name)
            u = mu * (torch.zeros_like(d) if u is None else u) + d
            self._u[name] = u
            out[name] = m[name] - lr * (d + mu * u) if self.nesterov else m[name] - lr * u
        return out

    def buffers(self, like: Params) -> Params:
        """Copies of the momentum buffers for every name in ``like`` (zeros where none exists yet)."""
        return {name: self._u[name].clone() if name in self._u else torch.zeros_like(t) for name, t in like.items()}

    def state_dict(self) -> Params:
        """The momentum buffers by parameter name (empty before the first step)."""
        return {name: u.clone() for name, u in self._u.items()}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        self._u = {name: torch.as_tensor(u).clone() for name, u in state.items()}


LossClosure = Callable[[nn.Module], torch.Tensor]
LossFn = Callable[[Any, Any], torch.Tensor]


class DilocoReplica:
    """One learner's replica: an ``nn.Module``, its inner AdamW (state kept across rounds) and the
    local ``OuterNesterov``. Pure state machine; the network (or ``mixing.simulate_round``) moves
    the snapshots and pseudo-gradients between replicas. Only parameters take part, not buffers.
    """

    def __init__(self, module: nn.Module, config: DilocoConfig | None = None) -> None:
        self.module = module
        self.config = config if config is not None else DilocoConfig()
        self._params = dict(module.named_parameters())
        self.inner_optimizer = torch.optim.AdamW(
            list(self._params.values()),
            lr=self.config.inner_lr,
            betas=self.config.inner_betas,
            weight_decay=self.config.inner_weight_decay,
        )
        self.outer = OuterNesterov.from_config(self.config)
        self.round = 0
        self._phase = "idle"
        self._x: Params | None = None

    @property
    def phase(self) -> str:
        """``idle``, ``inner`` (after begin_round) or ``outer`` (after end_inner)."""
        return self._phase

    def _expect(self, phase: str, action: str) -> None:
        if self._phase != phase:
            raise ProtocolError(f"{action} needs phase {phase!r}, replica is in {self._phase!r}")

    @torch.no_grad()
    def parameters_snapshot(self) -> Params:
        """Detached clones of the current parameters, on the module's device."""
        return {name: p.detach().clone() for name, p in self._params.items()}

    def begin_round(self) -> Params:
        """Snapshot x (what the non-blocking parameter mix sends) and enter the inner phase."""
        self._expect("idle", "begin_round")
        self._x = self.parameters_snapshot()
        self._phase = "inner"
        return self._x

    def momentum_snapshot(self) -> Params:
        """The outer momentum u this round's step starts from, on the module's device (zeros before
        the first step): what the parameter mix sends beside x when the plan mixes momentum."""
        return self.outer.buffers(self._x if self._x is not None else self.parameters_snapshot())

    def inner_step(self, x_batch: Any, y_batch: Any = None, loss_fn: LossFn | None = None) -> float:
        """One AdamW step with gradient clipping; returns the loss before the step.

        Either ``inner_step(x_batch, y_batch, loss_fn)`` with loss = loss_fn(module(x_batch), y_batch),
        or ``inner_step(compute_loss)`` with loss = compute_loss(module). A non-finite loss raises
        ProtocolError and leaves parameters and optimizer state untouched.
        """
        self._expect("inner", "inner_step")
        if loss_fn is not None:
            return self._optimize(lambda: loss_fn(self.module(x_batch), y_batch))
        if not callable(x_batch) or y_batch is not None:
            raise ProtocolError("inner_step needs (x_batch, y_batch, loss_fn) or one loss callable")
        return self._optimize(lambda: x_batch(self.module))

    def _optimize(self, compute: Callable[[], torch.Tensor]) -> float:
        self.inner_optimizer.zero_grad(set_to_none=True)
        loss = compute()
        loss.backward()
        value = float(loss.detach())
        if not math.isfinite(value):
            self.inner_optimizer.zero_grad(set_to_none=True)
            raise ProtocolError(f"non-finite inner loss {value} in round {self.round}")
        if self.config.grad_clip > 0:
            nn.utils.clip_grad_norm_(list(self._params.values()), self.config.grad_clip)
        self.inner_optimizer.step()
        return value

    def end_inner(self) -> Params:
        """Leave the inner phase; return the pseudo-gradient d = x - y."""
        self._expect("inner", "end_inner")
        assert self._x is not None
        self._phase = "outer"
        return pseudo_gradient(self._x, self.parameters_snapshot())

    @property
    def snapshot(self) -> Params:
        """x of the current round (valid between begin_round and finish_round)."""
        if self._x is None:
            raise ProtocolError("no round in progress")
        return self._x

    @torch.no_grad()
    def finish_round(self, m: Params, d_mixed: Params, u_mixed: Params | None = None, *,
                     frozen: Collection[str] = ()) -> None:
        """Outer step from the mixed parameters ``m`` with ``d_mixed`` (and the mixed momentum
        ``u_mixed``, if the plan mixes it); each covers every parameter (pass x itself in m, and
        the own d in d_mixed, for parameters that were not mixed) except the ``frozen`` ones, which
        skip the outer step: they return to x and their momentum stays as it was (FoMoE: experts
        this peer does not hold, and experts that saw no tokens)."""
        self._expect("outer", "finish_round")
        frozen = frozenset(frozen)
        unknown = sorted(frozen - self._params.keys())
        if unknown:
            raise ProtocolError(f"finish_round: frozen names are not parameters: {unknown}")
        stepped = self._params.keys() - frozen
        for label, given in (("m", m), ("d_mixed", d_mixed), ("u_mixed", u_mixed)):
            if given is not None and given.keys() != stepped:
                raise ProtocolError(f"finish_round: {label} must cover every parameter that is not frozen; "
                                    f"differs in {sorted(set(given) ^ stepped)}")
        u_on_device = None if u_mixed is None else self._on_device(u_mixed, stepped)
        x_new = self.outer.step(self._on_device(m, stepped), self._on_device(d_mixed, stepped), u_on_device)
        assert self._x is not None
        for name, p in self._params.items():
            p.copy_(self._x[name] if name in frozen else x_new[name])
        self._x = None
        self._phase = "idle"
        self.round += 1

    @torch.no_grad()
    def adopt(self, params: Params, round: int) -> None:
        """Take the swarm's parameters at ``round`` (joining, or catching up after falling behind).
        The outer momentum, accumulated along this replica's own past, is reset; so is the inner
        optimizer's state."""
        self._expect("idle", "adopt")
        if params.keys() != self._params.keys():
            raise ProtocolError(f"adopt: parameters differ in {sorted(set(params) ^ set(self._params))}")
        if isinstance(round, bool) or not isinstance(round, int) or round < 0:
            raise ProtocolError(f"adopt: round must be a non-negative int, got {round!r}")
        adopted = self._on_device(params)
        for name, p in self._params.items():
            p.copy_(adopted[name])
        self.outer = OuterNesterov.from_config(self.config)
        self.inner_optimizer.state.clear()
        self.round = round

    def _on_device(self, params: Params, names: Collection[str] | None = None) -> Params:
        out: Params = {}
        for name, p in self._params.items():
            if names is not None and name not in names:
                continue
            t = params[name]
            if t.shape != p.shape:
                raise ProtocolError(f"parameter {name}: shape {tuple(t.shape)} != {tuple(p.shape)}")
            out[name] = t.to(device=p.device, dtype=p.dtype)
        return out

    def state_dict(self) -> dict[str, Any]:
        """Checkpoint between rounds: module, inner optimizer, outer momentum and round. A snapshot:
        it shares no tensors with the live replica."""
        self._expect("idle", "state_dict")
        return copy.deepcopy({
            "round": self.round,
            "module": self.module.state_dict(),
            "inner_optimizer": self.inner_optimizer.state_dict(),
            "outer": self.outer.state_dict(),
        })

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._expect("idle", "load_state_dict")
        state = copy.deepcopy(dict(state))  # the optimizer would otherwise alias the caller's tensors
        self.module.load_state_dict(state["module"])
        self.inner_optimizer.load_state_dict(state["inner_optimizer"])
        outer = state["outer"]
        unknown = sorted(set(outer) - set(self._params))
        if unknown:
            raise ProtocolError(f"outer momentum for unknown parameters: {unknown}")
        self.outer.load_state_dict({n: u.to(self._params[n].device) for n, u in outer.items()})
        self.round = int(state["round"])
