"""The TL++ experiment's datasets, split ONE CLASS PER NODE and read with the data nodes' own loader,
and the model each trains (``load_task``): ``digits`` (8x8, the built-in ``digits_cnn``, pixels in
[0, 1]) and ``fashion-mnist`` (28x28, the 4-stage CNN below, inputs normalised per channel from
statistics pooled from the nodes' counts and sums)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from gossamer.protocols.tlpp.core import (
    Declaration,
    Normalize,
    build_stages,
    builtin_stages,
    channel_stats,
    pool_stats,
)
from gossamer.protocols.tlpp.data import load_data

FASHION_STAGES: Declaration = (("conv 16", "relu", "maxpool 2"), ("conv 32", "relu", "maxpool 2"),
                               ("flatten", "linear 64", "relu"), ("linear 10",))
DATASETS = ("digits", "fashion-mnist")


@dataclass
class Task:
    """Each node's samples and labels (node k holds class k), the held-out test set, and the model."""

    name: str
    xs: dict[str, torch.Tensor]
    ys: dict[str, torch.Tensor]
    x_test: torch.Tensor
    y_test: torch.Tensor
    stages: Declaration
    input_shape: tuple[int, ...]
    normalization: tuple[tuple[float, ...], tuple[float, ...]] | None
    dtype: torch.dtype

    def batch(self, by_node: dict[str, list[int]]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        return ({n: self.xs[n][idx] for n, idx in by_node.items()},
                {n: self.ys[n][idx] for n, idx in by_node.items()})

    def model(self, seed: int, device: torch.device) -> nn.Sequential:
        """The task's model, initialised from ``seed``, with the pooled normalisation when it has one."""
        first = None
        if self.normalization is not None:
            first = Normalize(self.input_shape)
            first.set(*self.normalization)
        return build_stages(self.stages, input_shape=self.input_shape, num_classes=10, seed=seed, device=device,
                            dtype=self.dtype, first=first)


def load_task(name: str, *, device: torch.device, dtype: torch.dtype, per_class: int) -> Task:
    if name == "digits":
        source, shape, stages, normalize = "builtin:digits", (1, 8, 8), builtin_stages("digits_cnn", num_classes=10), False
    else:
        source, shape, stages, normalize = "builtin:fashion-mnist", (1, 28, 28), FASHION_STAGES, True
    train = load_data(source, input_shape=shape, num_classes=10)
    test = load_data(f"{source}:test", input_shape=shape, num_classes=10)
    limit = per_class if name == "fashion-mnist" else None
    picked = {f"node{k}": torch.nonzero(train.y == k).flatten()[:limit] for k in range(10)}
    normalization = pool_stats([channel_stats(train.x[i]) for i in picked.values()], positions=shape[1] * shape[2]) \
        if normalize else None
    return Task(name=name, xs={n: train.x[i].to(device, dtype) for n, i in picked.items()},
                ys={n: train.y[i].to(device) for n, i in picked.items()}, x_test=test.x.to(device, dtype),
                y_test=test.y.to(device), stages=stages, input_shape=shape, normalization=normalization, dtype=dtype)


def accuracy(model: nn.Module, task: Task, *, chunk: int = 1000) -> float:
    with torch.no_grad():
        correct = sum(int((model(x).argmax(1) == y).sum())
                      for x, y in zip(task.x_test.split(chunk), task.y_test.split(chunk), strict=True))
    return correct / len(task.y_test)
