"""Protocol ``tlpp``: TL++ traversal learning on private data (``protocols/tlpp/README.md``).
Roles: ``node`` (a data owner), ``orchestrator`` (the run owner's trainer: ``steps`` runs a virtual
batch, ``timing`` times its requests, ``ledger`` records it) and secure mode's ``helper``; ``wire``
is what they say, ``settings`` the run config, ``data`` where samples come from, ``names`` the role
names, ``commands`` ``gossamer helper`` and ``gossamer node``; ``core`` is the pure part."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gossamer.peer.plugin import EventSchema, FinishRule, ProtocolPlugin
from gossamer.protocols.tlpp import names
from gossamer.protocols.tlpp.commands import HELPER, NODE

STEP_FIELDS = ("expected", "arrived", "used", "rejected", "timed_out", "send_failures", "step", "epoch", "index",
               "mode", "planned", "samples", "loss", "accuracy", "applied", "note", "bytes_sent", "bytes_received",
               "wall_s", "deadline_s", "slow")  # a StepLedger's fields (a test checks they are)
EVENTS = {
    "waiting": EventSchema("training waits for min_nodes nodes (and, in secure mode, a helper that sees them live: "
                           "helper_sees, null until a helper was asked)", ("nodes", "wanted", "helpers", "helper_sees")),
    "normalized": EventSchema("the input normalisation pooled from the nodes' per-channel counts and sums",
                              ("nodes", "samples", "mean", "std")),
    "step": EventSchema("one virtual batch done; its ledger (nodes used, and rejected with the phase and reason; "
                        "each phase's deadline, the nodes flagged fail-slow)",
                        (*STEP_FIELDS, "balance_problems")),
    "eval": EventSchema("an evaluation on the orchestrator's held-out split",
                        ("step", "steps", "loss", "accuracy", "samples")),
    "finished": EventSchema("training reached its steps; final evaluation and checkpoint",
                            ("step", "applied_steps", "test_loss", "test_accuracy", "checkpoint")),
    "error": EventSchema("training stopped with an error (e.g. the helper failed); a checkpoint of the model so far",
                         ("step", "message", "kind", "checkpoint")),
}


def describe(event: str, e: Mapping[str, Any]) -> str | None:
    if event == "step":
        dropped = f"  dropped {len(e['rejected'])}" if e["rejected"] else ""
        slow = f"  {len(e['slow'])} slow" if e.get("slow") else ""
        return (f"step {e['step']} (epoch {e['epoch']}): loss {e['loss']:.3f}  accuracy {e['accuracy']:.3f}  "
                f"{e['samples']} samples from {len(e['used'])} node(s){dropped}{slow}")
    if event == "eval":
        return f"held-out at step {e['step']}: loss {e['loss']:.3f}, accuracy {e['accuracy']:.3f}"
    if event == "finished":
        return (f"finished after {e['step']} steps: test loss {e['test_loss']:.3f}, accuracy "
                f"{e['test_accuracy']:.3f}; checkpoint {e['checkpoint']}")
    if event == "waiting":
        seen = "" if e["helper_sees"] is None else f", the helper sees {e['helper_sees']}"
        return f"waiting for nodes: {e['nodes']} of {e['wanted']} live, {e['helpers']} helper(s){seen}"
    if event == "normalized":
        return f"input normalisation from {len(e['nodes'])} node(s), {e['samples']} samples"
    if event == "error":
        return f"training stopped: {e['message']} (checkpoint {e['checkpoint']})"
    return None


def progress(event: str, e: Mapping[str, Any]) -> tuple[int, int] | None:
    if event == "eval" and e.get("steps"):
        return e["step"], e["steps"]
    return None


def settings() -> type:
    from gossamer.protocols.tlpp.settings import TlppSettings

    return TlppSettings


def roles() -> dict[str, Any]:
    from gossamer.protocols.tlpp.helper import TlppHelperRole
    from gossamer.protocols.tlpp.node import TlppNodeRole
    from gossamer.protocols.tlpp.orchestrator import TlppOrchestratorRole

    return {names.ORCHESTRATOR: TlppOrchestratorRole, names.NODE: TlppNodeRole, names.HELPER: TlppHelperRole}


PLUGIN = ProtocolPlugin(
    name=names.PROTOCOL,
    summary="TL++ traversal learning: private data stays on its nodes; secure mode secret-shares the cut",
    settings=settings,
    roles=(names.ORCHESTRATOR, names.NODE, names.HELPER,),
    load_roles=roles,
    owner_roles=(names.ORCHESTRATOR,),
    swarm_roles=(names.NODE,),
    commands=(HELPER, NODE),
    events=EVENTS,
    finish=FinishRule("finished", by="owner"),
    describe_event=describe,
    progress=progress,
)
