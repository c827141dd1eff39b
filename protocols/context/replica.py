"""A shard's copy of the run's model: parameters, AdamW, the version (updates applied), the state
joiners download (a snapshot after each update), and the run's data. Every shard applies every
update itself and then takes the leader's bases, so bases agree bitwise on every device.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from gossamer.peer.errors import ConfigError, PeerError
from gossamer.protocols.context.core import (
    BACKWARD,
    FORWARD,
    apply_update,
    build_context_model,
    payload_bytes,
    ring_spec,
    split_chunks,
)
from gossamer.protocols.context.core.subspace import basis_parameters
from gossamer.protocols.context.settings import ContextSettings
from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.core.text_data import BatchSampler, evaluate, load_text, split_text

MODEL, ADAMW = "model.", "adamw."
MOMENTS = ("exp_avg", "exp_avg_sq", "step")
STEP_SEED_STRIDE = 1_000_003


class StateMismatch(PeerError):
    """A downloaded state does not fit this run's model (names, shapes or dtypes differ)."""


@dataclass(frozen=True)
class RingData:
    """The run's text, split, and its digest (every shard of a ring must train on the same text)."""

    train: Tensor
    heldout: Tensor
    digest: str

    @classmethod
    def load(cls, source: str, *, heldout_fraction: float) -> RingData:
        try:
            text = load_text(source)
            split = split_text(text, heldout_fraction=heldout_fraction)
        except InvalidSetting as exc:
            raise ConfigError(f"data.source: {exc}") from exc
        return cls(train=split.train, heldout=split.heldout, digest=hashlib.sha256(text).hexdigest())

    def chunk(self, *, step: int, seed: int, batch_size: int, chunks: int, chunk_tokens: int,
              index: int) -> tuple[Tensor, Tensor]:
        """Member ``index``'s (tokens, targets) of step ``step``: every member draws the same
        sequences of ``chunks x chunk_tokens`` tokens and keeps its chunk of each."""
        generator = torch.Generator().manual_seed(seed * STEP_SEED_STRIDE + step)
        sampler = BatchSampler(self.train, batch_size=batch_size, context=chunks * chunk_tokens, generator=generator)
        tokens, targets = sampler.sample("cpu")
        return split_chunks(tokens, targets, chunks)[index]


def build_optimizer(model: torch.nn.Module, settings: ContextSettings) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)


class Replica:
    """The model, its optimizer and its version; ``model_state`` is the snapshot joiners download."""

    def __init__(self, settings: ContextSettings, device: torch.device) -> None:
        self.settings = settings
        self.device = device
        self.model = build_context_model(settings.model, settings.subspace, seed=settings.seed, device=device)
        self.optimizer = build_optimizer(self.model, settings)
        self.version = 0
        self._published = (0, self._state())  # (version, state) in one attribute: read and replaced whole
        spec = ring_spec(self.model, step=0, chunks=1, batch=settings.batch_size, tokens=settings.chunk_tokens)
        self.coefficient_bytes = {kind: payload_bytes(spec, kind) for kind in (FORWARD, BACKWARD)}
        self.gradient_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.basis_bytes = sum(p.numel() * p.element_size() for _, p in basis_parameters(self.model))

    # -- updates --------------------------------------------------------------------------------

    def apply(self, grads: Mapping[str, Tensor], bases: Mapping[str, Tensor] | None = None) -> float:
        """One update from the summed gradient; then the leader's ``bases`` (None on the leader)
        replace ours. Runs in a worker thread; returns the gradient norm before clipping."""
        norm = apply_update(self.model, self.optimizer, dict(grads), grad_clip=self.settings.grad_clip)
        if bases is not None:
            with torch.no_grad():
                for name, param in basis_parameters(self.model):
                    param.copy_(bases[name].to(param.device, param.dtype))
        state = self._state()
        self.version += 1
        self._published = (self.version, state)
        return norm

    def bases(self) -> dict[str, Tensor]:
        """This model's bases, on the CPU (what the leader sends with an update)."""
        return {name: param.detach().to("cpu", copy=True) for name, param in basis_parameters(self.model)}

    def parameter_specs(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {name: (tuple(p.shape), p.dtype) for name, p in self.model.named_parameters()}

    def basis_names(self) -> list[str]:
        return [name for name, _ in basis_parameters(self.model)]

    # -- the state joiners download ---------------------------------------------------------------

    def model_state(self) -> tuple[int, Mapping[str, Tensor]]:
        """(version, tensors) as of the last update (never changed in place). The update runs in a
        worker thread while the daemon may ask for this: the pair is replaced in one assignment."""
        return self._published

    def _state(self) -> dict[str, Tensor]:
        tensors = {MODEL + name: p.detach().to("cpu", copy=True) for name, p in self.model.named_parameters()}
        for name, param in self.model.named_parameters():
            for key, value in self.optimizer.state.get(param, {}).items():
                if key in MOMENTS:
                    tensors[f"{ADAMW}{name}.{key}"] = value.detach().to("cpu", copy=True).reshape(value.shape)
        return tensors

    def adopt(self, version: int, tensors: Mapping[str, Tensor]) -> None:
        """Take a downloaded state (StateMismatch, nothing changed, when it does not fit)."""
        params = dict(self.model.named_parameters())
        for name, param in params.items():
            got = tensors.get(MODEL + name)
            if got is None or got.shape != param.shape or got.dtype != param.dtype:
                raise StateMismatch(f"downloaded state: {MODEL + name} is missing or has another shape or dtype")
        moments = {name: {key: tensors[f"{ADAMW}{name}.{key}"] for key in MOMENTS if f"{ADAMW}{name}.{key}" in tensors}
                   for name in params}
        with torch.no_grad():
            for name, param in params.items():
                param.copy_(tensors[MODEL + name].to(param.device))
        self.optimizer = build_optimizer(self.model, self.settings)
        for name, param in params.items():
            if moments[name]:
                self.optimizer.state[param] = {key: (value.clone() if key == "step" else value.to(param.device).clone())
                                               for key, value in moments[name].items()}
        self.version = version
        self._published = (version, self._state())

    def heldout_loss(self, heldout: Tensor, *, context: int) -> float:
        """Mean next-byte loss on ``heldout`` at ``context`` tokens (run it in a worker thread)."""
        return evaluate(self.model, heldout, context=context, max_batches=self.settings.eval_batches,
                        device=self.device)
