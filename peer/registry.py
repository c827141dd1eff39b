"""The roles this version of gossamer can take, by name (later protocols add theirs here)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from peer.ar_pipeline import ArStageRole
from peer.block_coordinator import BlockCoordinatorRole
from peer.block_server import BlockServerRole
from peer.block_worker import BlockWorkerRole
from peer.learner import LearnerRole
from peer.roles import OrchestratorRole, RoleFactory
from peer.tlpp_helper import TlppHelperRole
from peer.tlpp_node import TlppNodeRole
from peer.tlpp_orchestrator import TlppServerRole

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
