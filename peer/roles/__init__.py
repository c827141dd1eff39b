"""The roles this version of gossamer can take, by name (later protocols add theirs here)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gossamer.peer.role import OrchestratorRole, RoleFactory
from gossamer.peer.roles.blocktrain.ar_stage import ArStageRole
from gossamer.peer.roles.blocktrain.coordinator import BlockCoordinatorRole
from gossamer.peer.roles.blocktrain.server import BlockServerRole
from gossamer.peer.roles.blocktrain.worker import BlockWorkerRole
from gossamer.peer.roles.diloco.learner import LearnerRole
from gossamer.peer.roles.tlpp.helper import TlppHelperRole
from gossamer.peer.roles.tlpp.node import TlppNodeRole
from gossamer.peer.roles.tlpp.server import TlppServerRole

ROLE_FACTORIES: Mapping[str, RoleFactory] = MappingProxyType({
    "orchestrator": OrchestratorRole,
    "learner": LearnerRole,
    "block-coordinator": BlockCoordinatorRole,
    "block-worker": BlockWorkerRole,
    "block-server": BlockServerRole,
    "ar-stage": ArStageRole,
    "tlpp-server": TlppServerRole,
    "node": TlppNodeRole,
    "helper": TlppHelperRole,
})
