"""Shared parts of the DiLoCo chaos scripts (``fault_matrix.py``, ``wan_faults.py``, ``churn.py``):
the in-process run they all train, whether a set of learners agrees bit for bit."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gossamer.protocols.core.models import flat_parameters
from gossamer.protocols.diloco.learner import LearnerRole


def run_config(name: str, *, peers: int, rounds: int, deadline_s: float,
               aggregator: Mapping[str, Any] | None = None, w1_clip_tau: float = 0.0) -> dict:
    """A tiny byte LM, global mixing with an exact-average round every second round, W2 through
    ``aggregator`` (the manifest's ``[hyper.aggregator]`` table: name and parameters; mean W2 when
    None), W1 clipped gossip when ``w1_clip_tau`` > 0; adaptive pacing with its floor at the
    deadline: the waits are the deadline, but a learner whose record left the view is not waited for."""
    return {"run": {"name": name, "protocol": "diloco", "heartbeat_s": 30.0},
            "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 16},
            "hyper": {"rounds": rounds, "batch_size": 4, "eval_batches": 1, "min_learners": peers,
                      "w1_grace_s": deadline_s, "w2_deadline_s": deadline_s, "w1_clip_tau": w1_clip_tau,
                      "pacing": "adaptive", "w2_floor_s": deadline_s,
                      "diloco": {"inner_steps": 2, "inner_lr": 0.003},
                      "mixing": {"w1": "global", "w2": "global", "average_every": 2},
                      "aggregator": dict(aggregator or {"name": "mean"})}}


def bit_identical(roles: list[LearnerRole]) -> bool:
    """Whether the learners' parameters and outer momentum are equal bit for bit."""
    states = [(flat_parameters(role.replica.module), role.replica.outer.state_dict()) for role in roles]
    return all(all(torch.equal(states[0][0][k], x[k]) and torch.equal(states[0][1][k], u[k]) for k in x)
               for x, u in states[1:])

