"""Checkpoints: written atomically, read back only for the same run and format, and the torn temp
file of an interrupted write is cleaned up when the directory is opened again."""

from __future__ import annotations

from pathlib import Path

import torch

from gossamer.peer.kit.checkpoint import Checkpoints


def test_a_checkpoint_round_trips_with_its_metadata(tmp_path: Path) -> None:
    files = Checkpoints(tmp_path / "ckpt", run_id="r@0123", format="gossamer/test")
    path = files.write("model", {"w": torch.arange(6.0).view(2, 3)}, round="4")

    tensors, metadata = files.read("model")  # type: ignore[misc]
    assert path == tmp_path / "ckpt" / "model.safetensors"
    assert torch.equal(tensors["w"], torch.arange(6.0).view(2, 3))
    assert metadata == {"run_id": "r@0123", "format": "gossamer/test", "round": "4"}


def test_another_runs_or_formats_file_is_not_read(tmp_path: Path) -> None:
    Checkpoints(tmp_path, run_id="a@0", format="gossamer/test").write("model", {"w": torch.ones(1)})

    assert Checkpoints(tmp_path, run_id="b@0", format="gossamer/test").read("model") is None
    assert Checkpoints(tmp_path, run_id="a@0", format="gossamer/other").read("model") is None
    assert Checkpoints(tmp_path, run_id="a@0", format="gossamer/test").read("model", kind="block") is None
    assert Checkpoints(tmp_path, run_id="a@0", format="gossamer/test").read("missing") is None


def test_a_file_that_is_not_a_finite_checkpoint_is_not_read(tmp_path: Path) -> None:
    files = Checkpoints(tmp_path, run_id="a@0", format="gossamer/test")
    files.write("nan", {"w": torch.tensor([float("nan")])})
    (tmp_path / "junk.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")

    assert files.read("nan") is None and files.read("junk") is None


def test_a_torn_temp_file_left_by_a_killed_writer_is_removed(tmp_path: Path) -> None:
    Checkpoints(tmp_path, run_id="a@0", format="gossamer/test").write("model", {"w": torch.ones(2)})
    torn = tmp_path / ".model.safetensors.k3j2.tmp"
    torn.write_bytes(b"half a file")

    files = Checkpoints(tmp_path, run_id="a@0", format="gossamer/test")

    assert not torn.exists() and files.read("model") is not None
