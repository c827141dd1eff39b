"""Where a TL++ data node's samples come from (``--data``: ``builtin:NAME[:shard=K/N|:class=C]`` or
a local ``.npz`` with ``x`` and ``y``) and the held-out split the orchestrator keeps (``data.test``).
A source that does not fit the run's ``model.input_shape`` and classes is refused naming the shape
the run expects. The sources are listed in ``protocols/tlpp/README.md``, "Data"."""

from __future__ import annotations

import gzip
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from gossamer.peer.errors import ConfigError

if TYPE_CHECKING:
    from gossamer.protocols.tlpp.settings import TlppSettings

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_PACKAGE = "dataset-fashion-mnist"
_SHARD = re.compile(r"^shard=(\d+)/(\d+)$")
_CLASS = re.compile(r"^class=(\d+(?:,\d+)*)$")


class DataSourceError(ConfigError):
    """A ``--data`` source that cannot be read or does not hold valid images and labels; the
    message names the source and the problem."""


@dataclass(frozen=True)
class NodeData:
    """Samples [N, *input_shape] float32 and labels [N] int64 of one source (CPU tensors)."""

    source: str
    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return int(self.y.shape[0])


@dataclass(frozen=True)
class Split:
    """A built-in dataset: raw images [N, C, H, W] (times ``scale``: in [0, 1]), labels, and the train
    and test indices."""

    images: np.ndarray
    scale: float
    labels: np.ndarray
    train: np.ndarray
    test: np.ndarray


def load_data(source: str, *, input_shape: tuple[int, ...], num_classes: int, test_fraction: float = 0.2,
              split_seed: int = 0, fashion_dir: Path | str = FASHION_MNIST_DIR) -> NodeData:
    """Read ``source`` (``builtin:...`` or a ``.npz``) and check it against the run's model input
    shape and classes; DataSourceError names what is wrong (and the shape the run expects)."""
    if not isinstance(source, str) or not source:
        raise DataSourceError("data source is empty; pass e.g. --data builtin:digits:shard=0/4 or --data FILE.npz")
    if source.startswith("builtin:"):
        name, _, selector = source[len("builtin:"):].partition(":")
        readers: dict[str, Callable[[], Split]] = {
            "digits": lambda: _digits(test_fraction, split_seed), "fashion-mnist": lambda: _fashion(source, Path(fashion_dir))}
        if name not in readers:
            raise DataSourceError(f"data source {source!r}: unknown built-in; TL++ knows builtin:digits and "
                                  "builtin:fashion-mnist, each [:shard=K/N|:class=C|:test]")
        split = readers[name]()
        picked = _select(source, selector, split, num_classes)
        x, y = split.images[picked].astype(np.float32) * np.float32(split.scale), split.labels[picked]
    else:
        x, y = _npz(source)
    return NodeData(source=source, x=_samples(source, x, input_shape), y=_labels(source, y, len(x), num_classes))


def load_run_data(source: str, settings: TlppSettings) -> NodeData:
    """``load_data`` with the run's input shape, classes and digits split."""
    return load_data(source, input_shape=settings.input_shape, num_classes=settings.num_classes,
                     test_fraction=settings.test_fraction, split_seed=settings.split_seed)


def default_node_source(peer_id: str, num_shards: int) -> str:
    """The shard a node without ``--data`` takes: its peer id modulo ``num_shards``."""
    return f"builtin:digits:shard={int(peer_id[:8], 16) % num_shards}/{num_shards}"


def _digits(test_fraction: float, split_seed: int) -> Split:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    train, test = train_test_split(np.arange(len(digits.target)), test_size=test_fraction,
                                   stratify=digits.target, random_state=split_seed)
    return Split(images=digits.images[:, None], scale=1 / 16, labels=digits.target, train=train, test=test)


def read_idx(path: Path) -> np.ndarray:
    """One IDX file (the MNIST format: magic, dimensions, unsigned bytes), gzip'd or not."""
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    if len(data) < 4 or data[:3] != b"\x00\x00\x08":
        raise ValueError(f"{path} is not an IDX file of unsigned bytes")
    dims = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims)
    if body.size != int(np.prod(shape)):
        raise ValueError(f"{path}: {body.size} bytes for a shape {shape}")
    return body.reshape(shape)


def _fashion(source: str, folder: Path) -> Split:
    files = [folder / f"{part}-{kind}-idx{dims}-ubyte.gz" for part in ("train", "t10k")
             for kind, dims in (("images", 3), ("labels", 1))]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise DataSourceError(f"data source {source!r}: Fashion-MNIST is not installed ({folder} lacks "
                              f"{', '.join(missing)}); install Debian's {FASHION_MNIST_PACKAGE} package "
                              f"(apt-get install {FASHION_MNIST_PACKAGE}) or pass an .npz file")
    try:
        train_x, train_y, test_x, test_y = (read_idx(f) for f in files)
    except (OSError, ValueError, EOFError) as exc:
        raise DataSourceError(f"data source {source!r}: cannot read the Fashion-MNIST files: {exc}") from exc
    n = len(train_y)
    return Split(images=np.concatenate([train_x, test_x])[:, None], scale=1 / 255, labels=np.concatenate([train_y, test_y]).astype(np.int64), train=np.arange(n),
                 test=np.arange(n, n + len(test_y)))


def _select(source: str, selector: str, split: Split, num_classes: int) -> np.ndarray:
    train, labels = split.train, split.labels
    if selector == "test":
        picked = split.test
    elif selector == "":
        picked = train
    elif match := _SHARD.match(selector):
        index, count = int(match[1]), int(match[2])
        if count < 1 or index >= count:
            raise DataSourceError(f"data source {source!r}: shard K/N needs N >= 1 and 0 <= K < N")
        picked = train[index::count]
    elif match := _CLASS.match(selector):
        classes = sorted({int(c) for c in match[1].split(",")})
        if classes[-1] >= num_classes:
            raise DataSourceError(f"data source {source!r}: classes must lie in [0, {num_classes})")
        picked = train[np.isin(labels[train], classes)]
    else:
        raise DataSourceError(f"data source {source!r}: unknown selector {selector!r}; use shard=K/N, class=C[,C...] "
                              "or test")
    if len(picked) == 0:
        raise DataSourceError(f"data source {source!r} selects no samples")
    return picked


def _npz(source: str) -> tuple[np.ndarray, np.ndarray]:
    path = Path(source).expanduser()
    if path.suffix != ".npz":
        raise DataSourceError(f"data source {source!r}: TL++ nodes read .npz files with arrays x and y (or a "
                              "builtin: source)")
    try:
        with np.load(path, allow_pickle=False) as archive:
            missing = sorted({"x", "y"} - set(archive.files))
            if missing:
                raise DataSourceError(f"data source {source!r}: missing arrays {missing}; need x and y")
            return archive["x"], archive["y"]
    except (OSError, ValueError) as exc:
        raise DataSourceError(f"data source {source!r}: cannot read it: {exc}") from exc


def expected_shape(input_shape: tuple[int, ...]) -> str:
    """How ``x`` must look for ``input_shape``, in words: "[N, 1, 28, 28] or [N, 28, 28]"."""
    full = "[N, " + ", ".join(map(str, input_shape)) + "]"
    if len(input_shape) == 3 and input_shape[0] == 1:
        return f"{full} or [N, {input_shape[1]}, {input_shape[2]}]"
    return full


def _samples(source: str, x: np.ndarray, input_shape: tuple[int, ...]) -> torch.Tensor:
    shape = tuple(x.shape)
    if x.ndim == 3 and len(input_shape) == 3 and input_shape[0] == 1:
        x = x[:, None]
    if tuple(x.shape[1:]) != tuple(input_shape) or x.shape[0] < 1:
        raise DataSourceError(f"data source {source!r}: x has shape {list(shape)}; this run's model takes x of shape "
                              f"{expected_shape(input_shape)} (model.input_shape = {list(input_shape)})")
    if x.dtype.kind not in "fiu":
        raise DataSourceError(f"data source {source!r}: x has dtype {x.dtype}; need numbers")
    samples = torch.tensor(x.astype(np.float32))
    if not bool(torch.isfinite(samples).all()):
        raise DataSourceError(f"data source {source!r}: x holds NaN or Inf")
    return samples


def _labels(source: str, y: np.ndarray, count: int, num_classes: int) -> torch.Tensor:
    if y.ndim != 1 or y.shape[0] != count:
        raise DataSourceError(f"data source {source!r}: y has shape {list(y.shape)}; need [{count}] (one label per "
                              "sample)")
    if y.dtype.kind not in "iu":
        raise DataSourceError(f"data source {source!r}: y has dtype {y.dtype}; need integer labels")
    if y.min() < 0 or y.max() >= num_classes:
        raise DataSourceError(f"data source {source!r}: labels must lie in [0, {num_classes}) (model.num_classes), "
                              f"got [{int(y.min())}, {int(y.max())}]")
    return torch.tensor(y.astype(np.int64))
