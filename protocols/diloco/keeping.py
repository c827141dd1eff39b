"""What a learner keeps between rounds and writes for a restart: the state at the end of its last
finished round (parameters, inner AdamW state, outer momentum, the sampler's generator, the loss
series), copied to the CPU, written to ``<checkpoint_dir>/<run>-<peer id>-state.safetensors`` on
request, and loaded back by a learner started again with the same identity.
"""

from __future__ import annotations

from typing import Any

from gossamer.peer.kit.checkpoint import Checkpoints
from gossamer.peer.kit.state_tree import resume_state, snapshot, write_state
from gossamer.protocols.core.text_data import BatchSampler
from gossamer.protocols.diloco.core.replica import DilocoReplica

MAX_SERIES = 2000  # loss points kept for /status (the swarm page's curves)


class KeptState:
    """The learner's round-boundary state and loss series (see the module docstring)."""

    def __init__(self, checkpoints: Checkpoints, name: str, *, model_json: str) -> None:
        self.checkpoints, self.name, self.model_json = checkpoints, name, model_json
        self.series: dict[str, list[list[float]]] = {"train_loss": [], "heldout_loss": []}
        self.boundary: dict[str, Any] = {}

    def take(self, replica: DilocoReplica, sampler: BatchSampler) -> None:
        """Keep everything the next round starts from (between rounds)."""
        self.boundary = snapshot({"round": replica.round, "module": replica.module.state_dict(),
                                  "inner_optimizer": replica.inner_optimizer.state_dict(),
                                  "outer": replica.outer.state_dict(), "sampler": sampler.generator.get_state(),
                                  "series": self.series})

    def add_losses(self, round: int, train_loss: float, heldout_loss: float) -> None:
        self.series["train_loss"].append([round, train_loss])
        self.series["heldout_loss"].append([round, heldout_loss])
        for points in self.series.values():
            del points[:-MAX_SERIES]

    async def write(self) -> str | None:
        """Write the state of the last finished round (what a restart resumes from)."""
        state = self.boundary
        return await write_state(self.checkpoints, self.name, state, round=str(state["round"]), model=self.model_json)

    def resume(self, replica: DilocoReplica, sampler: BatchSampler) -> str:
        """Load the state an earlier life of this learner wrote into ``replica`` and ``sampler``;
        its path, or "" when there is none."""
        def apply(state: dict[str, Any]) -> None:
            replica.load_state_dict(state)
            sampler.generator.set_state(state["sampler"])
            self.series = {key: [list(point) for point in points] for key, points in state["series"].items()}

        return resume_state(self.checkpoints, self.name, apply)
