"""Byte-level text data for the language-model protocols: ``load_text`` (built-in or a local file,
never the network), the held-out split (always the last fraction, so every peer agrees), shards,
``BatchSampler`` (seeded), a fixed evaluation, the inner loop, and ``TextRun``, the data and batch
settings every text-LM run repeats."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import torch
import torch.nn.functional as F
from torch import nn

from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.core.settings import check, setting

BUILTIN_PREFIX = "builtin:"


def _pydoc_topics() -> bytes:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics)).encode("utf-8")


BUILTIN_SOURCES: Mapping[str, Callable[[], bytes]] = MappingProxyType({"pydoc": _pydoc_topics})


def load_text(source: str) -> bytes:
    """The bytes of ``builtin:<name>`` or of the local file at path ``source``."""
    if source.startswith(BUILTIN_PREFIX):
        name = source.removeprefix(BUILTIN_PREFIX)
        if name not in BUILTIN_SOURCES:
            raise InvalidSetting(f"data source {source!r}: unknown; built-in sources are {sorted(BUILTIN_SOURCES)}")
        return BUILTIN_SOURCES[name]()
    try:
        data = Path(source).read_bytes()
    except OSError as error:
        raise InvalidSetting(f"data source {source!r}: cannot read ({error.strerror or error})") from error
    if not data:
        raise InvalidSetting(f"data source {source!r}: file is empty")
    return data


@dataclass(frozen=True)
class TextSplit:
    """Training and held-out bytes as 1-D uint8 tensors."""

    train: torch.Tensor
    heldout: torch.Tensor


def split_text(data: bytes, *, heldout_fraction: float = 0.05) -> TextSplit:
    """Split off the last ``heldout_fraction`` of ``data`` (rounded down) as the held-out part."""
    if not 0.0 < heldout_fraction < 1.0:
        raise InvalidSetting(f"heldout_fraction: must be in (0, 1), got {heldout_fraction!r}")
    heldout_bytes = int(len(data) * heldout_fraction)
    if heldout_bytes < 1 or heldout_bytes >= len(data):
        raise InvalidSetting(f"heldout_fraction: {heldout_fraction} of {len(data)} bytes leaves an empty part")
    everything = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    cut = len(data) - heldout_bytes
    return TextSplit(train=everything[:cut].clone(), heldout=everything[cut:].clone())


def shard(train: torch.Tensor, *, index: int, count: int) -> torch.Tensor:
    """The ``index``-th of ``count`` contiguous, near-equal pieces of ``train`` (a view)."""
    if not isinstance(count, int) or count < 1:
        raise InvalidSetting(f"count: must be a positive integer, got {count!r}")
    if not isinstance(index, int) or not 0 <= index < count:
        raise InvalidSetting(f"index: must be in [0, {count}), got {index!r}")
    if train.dim() != 1 or train.numel() < count:
        raise InvalidSetting(f"count: cannot cut {train.numel()} bytes (shape {tuple(train.shape)}) into {count} shards")
    total = train.numel()
    return train[index * total // count : (index + 1) * total // count]


def _windows(data: torch.Tensor, starts: torch.Tensor, context: int, device: torch.device | str):
    offsets = torch.arange(context + 1, device=data.device)
    window = data[starts.to(data.device)[:, None] + offsets].to(device=device, dtype=torch.long)
    return window[:, :-1], window[:, 1:]


class BatchSampler:
    """Random training windows: ``sample(device) -> (x, y)``, both [batch_size, context], y = x shifted."""

    def __init__(self, data: torch.Tensor, *, batch_size: int, context: int, generator: torch.Generator) -> None:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidSetting(f"batch_size: must be a positive integer, got {batch_size!r}")
        if not isinstance(context, int) or context < 1:
            raise InvalidSetting(f"context: must be a positive integer, got {context!r}")
        if data.dim() != 1 or data.numel() < context + 1:
            raise InvalidSetting(f"context: data of shape {tuple(data.shape)} is shorter than context + 1 = {context + 1}")
        self.data = data
        self.batch_size = batch_size
        self.context = context
        self.generator = generator

    def sample(self, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch of windows at positions drawn uniformly from the generator."""
        high = self.data.numel() - self.context
        starts = torch.randint(0, high, (self.batch_size,), generator=self.generator, device=self.generator.device)
        return _windows(self.data, starts, self.context, device)


def next_byte_loss(logits: torch.Tensor, targets: torch.Tensor, *, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy in nats of logits [B, T, V] against targets [B, T]."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction=reduction)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    heldout: torch.Tensor,
    *,
    context: int,
    batch_size: int = 32,
    max_batches: int = 8,
    device: torch.device | str,
) -> float:
    """Mean next-byte cross-entropy (nats) over fixed, evenly spaced windows of ``heldout``.

    Deterministic (no RNG); the model runs in eval mode and its mode is restored afterwards.
    """
    if heldout.dim() != 1 or heldout.numel() < context + 1:
        raise InvalidSetting(f"context: held-out data of shape {tuple(heldout.shape)} is shorter than context + 1")
    if batch_size < 1 or max_batches < 1:
        raise InvalidSetting(f"batch_size/max_batches: must be positive, got {batch_size}/{max_batches}")
    last_start = heldout.numel() - context - 1
    count = min(batch_size * max_batches, last_start + 1)
    starts = torch.arange(count) * last_start // max(count - 1, 1)
    was_training = model.training
    model.eval()
    try:
        total_nats = 0.0
        for batch_starts in starts.split(batch_size):
            x, y = _windows(heldout, batch_starts, context, device)
            total_nats += float(next_byte_loss(model(x), y, reduction="sum"))
    finally:
        model.train(was_training)
    return total_nats / (count * context)


def train_steps(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    sampler: BatchSampler,
    *,
    steps: int,
    device: torch.device | str,
    grad_clip: float | None = 1.0,
) -> float:
    """Run ``steps`` optimizer steps on batches from ``sampler``; return the mean training loss."""
    if not isinstance(steps, int) or steps < 1:
        raise InvalidSetting(f"steps: must be a positive integer, got {steps!r}")
    if grad_clip is not None and not grad_clip > 0:
        raise InvalidSetting(f"grad_clip: must be positive or None, got {grad_clip!r}")
    was_training = model.training
    model.train()
    total = torch.zeros((), device=device)
    try:
        for _ in range(steps):
            x, y = sampler.sample(device)
            loss = next_byte_loss(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if grad_clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            optimizer.step()
            total += loss.detach()
    finally:
        model.train(was_training)
    return float(total) / steps


@dataclass(frozen=True, kw_only=True)
class TextRun:
    """What every text-LM run's manifest says about its data and batches (``[data]`` and ``[hyper]``
    keys); a protocol's settings hold one (``setting(spread=True)``), with its own defaults."""

    data_source: str = setting("builtin:pydoc", table="data", key="source",
                               doc='the text: "builtin:pydoc" or a local file\'s path')
    heldout_fraction: float = setting(0.05, table="data", above=0.0, below=1.0,
                                      doc="the text's tail held out for evaluation, the same on every peer")
    seed: int = setting(0, table="hyper", low=0, doc="the run's seed: initial weights, shards, batches")
    batch_size: int = setting(16, table="hyper", low=1, doc="sequences per step on each peer")
    num_shards: int = setting(16, table="hyper", low=1, doc="shards the training text is cut into; a peer trains on one")
    eval_batches: int = setting(4, table="hyper", low=1, doc="held-out batches per evaluation")
    max_norm: float = setting(1e4, table="hyper", above=0.0,
                              doc="largest L2 norm of an update accepted from a peer (a larger one is refused)")

    def __post_init__(self) -> None:
        check(self)
