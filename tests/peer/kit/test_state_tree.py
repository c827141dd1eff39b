"""A role's resumable state survives a checkpoint file exactly: an optimizer's state (int keys,
tuples, None, step tensors), a generator's state and plain counters."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gossamer.peer.errors import ConfigError
from gossamer.peer.kit.checkpoint import Checkpoints
from gossamer.peer.kit.state_tree import pack_state, snapshot, unpack_state


def trained_optimizer(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, betas=(0.8, 0.9))
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(5, 4)).pow(2).mean().backward()
        optimizer.step()
    return model, optimizer


def test_an_optimizer_and_a_generator_round_trip_through_a_checkpoint_file(tmp_path: Path) -> None:
    _model, optimizer = trained_optimizer(0)
    generator = torch.Generator().manual_seed(7)
    torch.randn(3, generator=generator)
    state = snapshot({"optimizer": optimizer.state_dict(), "rng": generator.get_state(), "round": 4, "note": None})
    files = Checkpoints(tmp_path, run_id="r@0", format="gossamer/test")
    files.write("state", pack_state(state), kind="state")

    back = unpack_state(files.read("state", kind="state")[0])  # type: ignore[index]

    _other_model, other = trained_optimizer(1)
    other.load_state_dict(back["optimizer"])
    assert other.state_dict()["param_groups"] == optimizer.state_dict()["param_groups"]
    assert back["optimizer"]["param_groups"][0]["betas"] == (0.8, 0.9)
    for key, value in optimizer.state_dict()["state"].items():
        for name, tensor in value.items():
            assert torch.equal(other.state_dict()["state"][key][name], tensor)
    restored = torch.Generator()
    restored.set_state(back["rng"])
    assert torch.equal(torch.randn(3, generator=restored), torch.randn(3, generator=generator))
    assert (back["round"], back["note"]) == (4, None)


def test_tensors_without_a_layout_are_refused() -> None:
    with pytest.raises(ConfigError, match="no resumable state"):
        unpack_state({"w": torch.ones(1)})
