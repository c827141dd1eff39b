"""Where a TL++ data node's samples come from, and the held-out split the orchestrator keeps.

Sources (``--data`` of a node, ``data.test`` of the run)::

    builtin:digits              the whole training split of sklearn's bundled digits
    builtin:digits:shard=K/N    every N-th training sample from the K-th (K in [0, N))
    builtin:digits:class=3      the training samples of class 3 (``class=3,4`` for several)
    builtin:digits:test         the held-out test split (the orchestrator's, for evaluation)
    PATH.npz                    a local file with arrays ``x`` ([N, 8, 8] or [N, 1, 8, 8], float)
                                and ``y`` ([N], integer labels in [0, 10))

The digits (1,797 8x8 images, pixel values 0..16 scaled to [0, 1]) are split into train and test
with a stratified split of ``test_fraction`` under ``split_seed`` (sklearn's
``train_test_split``), so every host that reads the same manifest cuts the same split and the
test images never reach a node. Nothing is downloaded: the digits ship with scikit-learn.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gossamer.peer.errors import ConfigError

BUILTIN = "builtin:digits"
NUM_CLASSES = 10
IMAGE_SHAPE = (1, 8, 8)
_SHARD = re.compile(r"^shard=(\d+)/(\d+)$")
_CLASS = re.compile(r"^class=(\d+(?:,\d+)*)$")


class DataSourceError(ConfigError):
    """A ``--data`` source that cannot be read or does not hold valid images and labels; the
    message names the source and the problem."""


@dataclass(frozen=True)
class NodeData:
    """Images [N, 1, 8, 8] float32 and labels [N] int64 of one source (CPU tensors)."""

    source: str
    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return int(self.y.shape[0])


def load_data(source: str, *, test_fraction: float, split_seed: int) -> NodeData:
    """Read ``source`` (see the module docstring); DataSourceError names what is wrong."""
    if not isinstance(source, str) or not source:
        raise DataSourceError("data source is empty; pass e.g. --data builtin:digits:shard=0/4 or --data FILE.npz")
    if source == BUILTIN or source.startswith(BUILTIN + ":"):
        return _builtin(source, test_fraction=test_fraction, split_seed=split_seed)
    if source.startswith("builtin:"):
        raise DataSourceError(f"data source {source!r}: unknown built-in; TL++ knows {BUILTIN}[:shard=K/N|:class=C|:test]")
    return _npz(source)


def default_node_source(peer_id: str, num_shards: int) -> str:
    """The shard a node without ``--data`` takes: its peer id modulo ``num_shards``."""
    return f"{BUILTIN}:shard={int(peer_id[:8], 16) % num_shards}/{num_shards}"


def _digits_split(test_fraction: float, split_seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    train, test = train_test_split(np.arange(len(digits.target)), test_size=test_fraction,
                                   stratify=digits.target, random_state=split_seed)
    return digits.images / 16.0, digits.target, train, test


def _builtin(source: str, *, test_fraction: float, split_seed: int) -> NodeData:
    selector = source[len(BUILTIN) + 1:]
    images, labels, train, test = _digits_split(test_fraction, split_seed)
    if selector == "test":
        picked = test
    elif selector == "":
        picked = train
    elif match := _SHARD.match(selector):
        index, count = int(match[1]), int(match[2])
        if count < 1 or index >= count:
            raise DataSourceError(f"data source {source!r}: shard K/N needs N >= 1 and 0 <= K < N")
        picked = train[index::count]
    elif match := _CLASS.match(selector):
        classes = sorted({int(c) for c in match[1].split(",")})
        if classes[-1] >= NUM_CLASSES:
            raise DataSourceError(f"data source {source!r}: classes must lie in [0, {NUM_CLASSES})")
        picked = train[np.isin(labels[train], classes)]
    else:
        raise DataSourceError(f"data source {source!r}: unknown selector {selector!r}; use shard=K/N, class=C[,C...] "
                              "or test")
    if len(picked) == 0:
        raise DataSourceError(f"data source {source!r} selects no samples")
    return NodeData(source=source, x=torch.tensor(images[picked], dtype=torch.float32)[:, None],
                    y=torch.tensor(labels[picked], dtype=torch.int64))


def _npz(source: str) -> NodeData:
    path = Path(source).expanduser()
    if path.suffix != ".npz":
        raise DataSourceError(f"data source {source!r}: TL++ nodes read .npz files with arrays x and y (or a "
                              f"{BUILTIN} source)")
    try:
        with np.load(path, allow_pickle=False) as archive:
            missing = sorted({"x", "y"} - set(archive.files))
            if missing:
                raise DataSourceError(f"data source {source!r}: missing arrays {missing}; need x and y")
            x, y = archive["x"], archive["y"]
    except (OSError, ValueError) as exc:
        raise DataSourceError(f"data source {source!r}: cannot read it: {exc}") from exc
    return NodeData(source=source, x=_images(source, x), y=_labels(source, y, len(x)))


def _images(source: str, x: np.ndarray) -> torch.Tensor:
    shape = tuple(x.shape)
    if x.ndim == 3:
        x = x[:, None]
    if x.ndim != 4 or tuple(x.shape[1:]) != IMAGE_SHAPE or x.shape[0] < 1:
        raise DataSourceError(f"data source {source!r}: x has shape {shape}; need [N, 8, 8] or [N, 1, 8, 8]")
    if x.dtype.kind not in "fiu":
        raise DataSourceError(f"data source {source!r}: x has dtype {x.dtype}; need numbers")
    images = torch.tensor(x.astype(np.float32))
    if not bool(torch.isfinite(images).all()):
        raise DataSourceError(f"data source {source!r}: x holds NaN or Inf")
    return images


def _labels(source: str, y: np.ndarray, count: int) -> torch.Tensor:
    if y.ndim != 1 or y.shape[0] != count:
        raise DataSourceError(f"data source {source!r}: y has shape {tuple(y.shape)}; need [{count}] (one label per image)")
    if y.dtype.kind not in "iu":
        raise DataSourceError(f"data source {source!r}: y has dtype {y.dtype}; need integer labels")
    if y.min() < 0 or y.max() >= NUM_CLASSES:
        raise DataSourceError(f"data source {source!r}: labels must lie in [0, {NUM_CLASSES}), got "
                              f"[{int(y.min())}, {int(y.max())}]")
    return torch.tensor(y.astype(np.int64))
