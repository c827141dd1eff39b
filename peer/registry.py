"""The roles this version of gossamer can take, by name (later protocols add theirs here)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from peer.learner import LearnerRole
from peer.roles import OrchestratorRole, RoleFactory

ROLE_FACTORIES: Mapping[str, RoleFactory] = MappingProxyType({
    "orchestrator": OrchestratorRole,
    "learner": LearnerRole,
})
