"""TL++ data sources: the built-in digits split (disjoint, deterministic, the test split never
reaches a node), shards and classes, local .npz files, and a clear error for every bad source."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gossamer.peer.roles.tlpp.data import DataSourceError, default_node_source, load_data


def digits(source: str):
    return load_data(source, test_fraction=0.2, split_seed=0)


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
    ({"x": np.ones((3, 7, 8)), "y": np.zeros(3, dtype=int)}, r"shape \(3, 7, 8\)"),
    ({"x": np.full((2, 8, 8), np.nan), "y": np.zeros(2, dtype=int)}, "NaN"),
    ({"x": np.ones((2, 8, 8)), "y": np.zeros(3, dtype=int)}, "one label per image"),
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
