"""TL++ data sources: the built-in digits split (disjoint, deterministic, the test split never
reaches a node), shards and classes, Fashion-MNIST's IDX files (or an error naming the Debian
package), local .npz files of any [N, C, H, W] / [N, H, W] / [N, F] shape checked against the run's
model input, and a clear error for every bad source."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from gossamer.protocols.tlpp.data import DataSourceError, default_node_source, load_data, read_idx


def digits(source: str, input_shape: tuple[int, ...] = (1, 8, 8)):
    return load_data(source, input_shape=input_shape, num_classes=10, test_fraction=0.2, split_seed=0)


def rows(data) -> set[bytes]:
    return {bytes(np.asarray(row).tobytes()) + bytes([int(label)]) for row, label in zip(data.x, data.y, strict=True)}


def test_shards_partition_the_training_split_and_never_touch_the_test_split() -> None:
    train, test = digits("builtin:digits"), digits("builtin:digits:test")
    shards = [digits(f"builtin:digits:shard={k}/3") for k in range(3)]

    assert len(train) + len(test) == 1797 and sum(len(s) for s in shards) == len(train)
    assert train.x.shape[1:] == (1, 8, 8) and train.x.dtype == torch.float32 and float(train.x.max()) <= 1.0
    assert rows(test).isdisjoint(rows(train))
    assert set().union(*(rows(s) for s in shards)) == rows(train)
    assert torch.equal(digits("builtin:digits:shard=1/3").x, shards[1].x)  # deterministic


def test_classes_and_the_default_shard() -> None:
    assert set(digits("builtin:digits:class=3,7").y.tolist()) == {3, 7}
    assert default_node_source("0000000a" + "0" * 56, 4) == "builtin:digits:shard=2/4"


def test_a_local_npz_file(tmp_path: Path) -> None:
    np.savez(tmp_path / "mine.npz", x=np.ones((5, 8, 8), dtype=np.float64), y=np.arange(5))
    data = digits(str(tmp_path / "mine.npz"))

    assert data.x.shape == (5, 1, 8, 8) and data.x.dtype == torch.float32 and data.y.tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(("x_shape", "input_shape"), [
    ((4, 3, 32, 32), (3, 32, 32)), ((4, 28, 28), (1, 28, 28)), ((4, 1, 28, 28), (1, 28, 28)), ((4, 20), (20,))])
def test_npz_files_of_any_shape_the_run_declares(tmp_path: Path, x_shape: tuple, input_shape: tuple) -> None:
    x = np.random.default_rng(0).integers(0, 255, x_shape).astype(np.uint8)
    np.savez(tmp_path / "mine.npz", x=x, y=np.array([0, 9, 3, 3]))
    data = digits(str(tmp_path / "mine.npz"), input_shape)

    assert data.x.shape == (4, *input_shape) and data.x.dtype == torch.float32
    assert torch.equal(data.x.reshape(4, -1), torch.tensor(x.reshape(4, -1), dtype=torch.float32))


@pytest.mark.parametrize(("x_shape", "input_shape", "expected"), [
    ((4, 3, 32, 32), (1, 28, 28), r"x has shape \[4, 3, 32, 32\]; this run's model takes x of shape "
                                  r"\[N, 1, 28, 28\] or \[N, 28, 28\] \(model.input_shape = \[1, 28, 28\]\)"),
    ((4, 32, 32), (3, 32, 32), r"takes x of shape \[N, 3, 32, 32\] \("),
    ((4, 21), (20,), r"takes x of shape \[N, 20\] \("),
    ((4, 1, 20), (20,), r"takes x of shape \[N, 20\] \("),
    ((0, 20), (20,), r"x has shape \[0, 20\]"),
])
def test_data_that_does_not_fit_the_model_is_refused_naming_the_expected_shape(
        tmp_path: Path, x_shape: tuple, input_shape: tuple, expected: str) -> None:
    np.savez(tmp_path / "mine.npz", x=np.zeros(x_shape), y=np.zeros(x_shape[0], dtype=int))
    with pytest.raises(DataSourceError, match=expected):
        digits(str(tmp_path / "mine.npz"), input_shape)
    with pytest.raises(DataSourceError, match=r"builtin:digits.*takes x of shape \[N, 1, 28, 28\]"):
        digits("builtin:digits", (1, 28, 28))


def write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 8, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    path.write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes()))


def fake_fashion(folder: Path, train: int, test: int) -> dict[str, np.ndarray]:
    """IDX files in Fashion-MNIST's layout (the format ``dataset-fashion-mnist`` installs)."""
    rng = np.random.default_rng(1)
    arrays = {"train-images-idx3-ubyte": rng.integers(0, 256, (train, 28, 28)),
              "train-labels-idx1-ubyte": np.arange(train) % 10,
              "t10k-images-idx3-ubyte": rng.integers(0, 256, (test, 28, 28)),
              "t10k-labels-idx1-ubyte": np.arange(test) % 10}
    folder.mkdir()
    for name, array in arrays.items():
        write_idx(folder / f"{name}.gz", array)
    return arrays


def test_fashion_mnist_reads_the_debian_files(tmp_path: Path) -> None:
    arrays = fake_fashion(tmp_path / "fashion", train=30, test=20)

    def fashion(selector: str):
        return load_data(f"builtin:fashion-mnist{selector}", input_shape=(1, 28, 28), num_classes=10,
                         fashion_dir=tmp_path / "fashion")

    train, test, three, shard = fashion(""), fashion(":test"), fashion(":class=3"), fashion(":shard=1/3")
    assert train.x.shape == (30, 1, 28, 28) and len(test) == 20 and float(train.x.max()) <= 1.0
    assert torch.allclose(train.x[:, 0] * 255, torch.tensor(arrays["train-images-idx3-ubyte"], dtype=torch.float32))
    assert test.y.tolist() == (np.arange(20) % 10).tolist()
    assert set(three.y.tolist()) == {3} and len(three) == 3 and len(shard) == 10
    assert read_idx(tmp_path / "fashion" / "t10k-labels-idx1-ubyte.gz").shape == (20,)


def test_fashion_mnist_missing_names_the_debian_package(tmp_path: Path) -> None:
    with pytest.raises(DataSourceError, match="apt-get install dataset-fashion-mnist"):
        load_data("builtin:fashion-mnist", input_shape=(1, 28, 28), num_classes=10, fashion_dir=tmp_path)
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(b"junk")
    for name in ("train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        write_idx(tmp_path / f"{name}.gz", np.zeros(3))
    with pytest.raises(DataSourceError, match="cannot read the Fashion-MNIST files"):
        load_data("builtin:fashion-mnist", input_shape=(1, 28, 28), num_classes=10, fashion_dir=tmp_path)


@pytest.mark.parametrize(("source", "problem"), [
    ("", "empty"),
    ("builtin:pydoc", "unknown built-in"),
    ("builtin:digits:shard=3/3", "0 <= K < N"),
    ("builtin:digits:shard=0/0", "0 <= K < N"),
    ("builtin:digits:class=10", r"\[0, 10\)"),
    ("builtin:digits:half", "unknown selector"),
    ("data.csv", ".npz files"),
])
def test_bad_sources_are_refused(source: str, problem: str) -> None:
    with pytest.raises(DataSourceError, match=problem):
        digits(source)


@pytest.mark.parametrize(("arrays", "problem"), [
    ({"x": np.ones((3, 8, 8))}, r"missing arrays \['y'\]"),
    ({"x": np.ones((3, 7, 8)), "y": np.zeros(3, dtype=int)}, r"shape \[3, 7, 8\]"),
    ({"x": np.full((2, 8, 8), np.nan), "y": np.zeros(2, dtype=int)}, "NaN"),
    ({"x": np.ones((2, 8, 8)), "y": np.zeros(3, dtype=int)}, "one label per sample"),
    ({"x": np.ones((2, 8, 8)), "y": np.array([0.0, 1.0])}, "integer labels"),
    ({"x": np.ones((2, 8, 8)), "y": np.array([0, 12])}, r"\[0, 12\]"),
    ({"x": np.array([["a"] * 8] * 8)[None], "y": np.zeros(1, dtype=int)}, "need numbers"),
])
def test_bad_npz_files_are_refused(tmp_path: Path, arrays: dict, problem: str) -> None:
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(DataSourceError, match=problem):
        digits(str(tmp_path / "bad.npz"))


def test_an_unreadable_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "broken.npz").write_bytes(b"not a zip")
    with pytest.raises(DataSourceError, match="cannot read it"):
        digits(str(tmp_path / "broken.npz"))
    with pytest.raises(DataSourceError, match="cannot read it"):
        digits(str(tmp_path / "missing.npz"))
