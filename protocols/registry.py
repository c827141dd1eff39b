"""The protocols this build of gossamer knows: the one list of plugins (``PLUGINS``), read by the CLI
alone. Each protocol is a folder here whose ``__init__.py`` defines its ``PLUGIN``; ``orchestrator``
is the one generic role every run has. Adding a protocol is its folder and one line below
(docs/ARCHITECTURE.md, "Adding a protocol")."""

from __future__ import annotations

from gossamer.peer.plugin import PluginRegistry
from gossamer.protocols import blocktrain, context, diloco, fomoe, none, tlpp


def orchestrator() -> type:
    from gossamer.peer.orchestrator import OrchestratorRole

    return OrchestratorRole


GENERIC_COMMANDS = ("identity", "peer", "orchestrator", "token", "status", "swarm")

PLUGINS = PluginRegistry(
    none.PLUGIN,
    diloco.PLUGIN,
    blocktrain.PLUGIN,
    tlpp.PLUGIN,
    context.PLUGIN,
    fomoe.PLUGIN,
    generic_roles={"orchestrator": orchestrator},
    reserved_commands=GENERIC_COMMANDS,
)
