"""Protocol ``blocktrain``: a stack of denoiser blocks, each trained apart by volunteers and served
across hosts (``protocols/blocktrain/README.md``: the method, the roles, the wire, the settings).

- ``names``        the protocol's and its roles' names
- ``settings``     ``BlockTrainSettings``, read from the run's manifest
- ``coordinator``  role ``block-coordinator``: block checkpoints, assignment, the version loop
- ``versions``     the coordinator's version board (pure): updates offered, versions closed
- ``ledger``       ``VersionLedger``: what happened to each block version
- ``checkpoints``  the coordinator's block and E files
- ``worker``       role ``block-worker``: fetch, K local steps, signed update
- ``fetch``        finding the coordinator, downloading a block version
- ``stack``        a stack holding only some blocks; the names blocks travel under
- ``server``       role ``block-server``: serves blocks for route frames, follows new versions
- ``host``         ``BlockHost``: the checks and Euler steps of a block server's route frames
- ``ar_stage``     role ``ar-stage``: the matched autoregressive baseline's pipeline stages
- ``client``       passes and generation through block servers or AR stages
- ``generation``   ``gossamer generate``: join as a client, find the route, generate
- ``commands``     the ``serve`` and ``generate`` parsers (no torch at import)
- ``core``         the pure math and decisions (sans-I/O)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gossamer.peer.plugin import EventSchema, FinishRule, Panel, ProtocolPlugin
from gossamer.protocols.blocktrain import names
from gossamer.protocols.blocktrain.commands import GENERATE, SERVE

EVENTS = {
    "assignment": EventSchema("the coordinator (re)assigned blocks to workers",
                              ("assignment", "coverage", "versions")),
    "version": EventSchema("the coordinator closed a block version; its ledger in short",
                           ("block", "version", "used", "rejected", "timed_out", "train_loss", "update_norm",
                            "heldout_ce", "versions", "target", "deadline_s", "slow")),
    "finished": EventSchema("every block reached hyper.versions; the coordinator's checkpoints are final",
                            ("versions", "heldout_ce", "initial_heldout_ce", "checkpoints", "sample", "prompt")),
    "assigned": EventSchema("a worker took (or switched to) a block", ("block",)),
    "update": EventSchema("a worker sent an update for its block", ("block", "version", "loss", "accepted", "reason")),
    "error": EventSchema("a worker's cycle failed; it retries", ("error",)),
    "worker_finished": EventSchema("the coordinator said the run is finished; the worker stopped", ("updates",)),
    "serving": EventSchema("a block server holds these block versions", ("blocks", "versions")),
}


def describe(event: str, e: Mapping[str, Any]) -> str | None:
    if event == "version":
        ce = f"  held-out CE {e['heldout_ce']:.3f}" if e.get("heldout_ce") is not None else ""
        return (f"block {e['block']} version {e['version']}: {len(e['used'])} update(s) used, "
                f"{len(e['timed_out'])} timed out, {len(e['rejected'])} rejected{ce}")
    if event == "finished":
        ce = f"{e['heldout_ce']:.3f}" if e.get("heldout_ce") is not None else "-"
        if e.get("initial_heldout_ce") is not None:
            ce += f" (from {e['initial_heldout_ce']:.3f})"
        line = f"finished: block versions {e['versions']}, held-out CE {ce}; checkpoints {e['checkpoints']}"
        if e.get("sample") is not None:
            line += f"\n  sample (prompt {e['prompt']!r}): {e['sample']!r}"
        return line
    if event == "assignment":
        return f"blocks assigned; workers per block {e['coverage']}, versions {e['versions']}"
    if event == "assigned":
        return f"training block {e['block']}"
    if event == "update":
        verdict = "accepted" if e["accepted"] else f"refused ({e['reason']})"
        return f"update for block {e['block']} from version {e['version']}: loss {e['loss']:.3f}, {verdict}"
    if event == "worker_finished":
        return f"the run is finished; updates {e['updates']}"
    if event == "serving":
        return f"serving blocks {e['blocks']} at versions {e['versions']}"
    if event == "error":
        return f"cycle failed, retrying: {e['error']}"
    return None


def progress(event: str, e: Mapping[str, Any]) -> tuple[int, int] | None:
    if event == "version" and e.get("target"):
        return sum(min(v, e["target"]) for v in e["versions"]), e["target"] * len(e["versions"])
    return None


def panel(records: Sequence[Any]) -> Panel | None:
    """Block coverage: per block, the workers training it and the servers holding it (with their
    version; a private one that no relay reaches is marked: clients do not route through it)."""
    workers: dict[int, list[str]] = {}
    servers: dict[int, list[str]] = {}
    for record in records:
        label = record.name or record.peer_id[:12]
        block = record.assignment.get("block")
        if names.WORKER in record.roles and isinstance(block, int):
            workers.setdefault(block, []).append(label)
        versions = record.assignment.get("block_versions") or {}
        for k in record.assignment.get("blocks") or []:
            version = versions.get(str(k), versions.get(k)) if isinstance(versions, dict) else None
            servers.setdefault(k, []).append(label + (f" v{version}" if version is not None else "")
                                             + ("" if record.reachable else " (private: not routed)"))
    blocks = sorted({*workers, *servers})
    if not blocks:
        return None
    return Panel(title="block coverage", columns=("block", "workers", "servers"),
                 rows=[[k, ", ".join(workers.get(k, [])) or "-", ", ".join(servers.get(k, [])) or "-"] for k in blocks])


def settings() -> type:
    from gossamer.protocols.blocktrain.settings import BlockTrainSettings

    return BlockTrainSettings


def roles() -> dict[str, Any]:
    from gossamer.protocols.blocktrain.ar_stage import ArStageRole
    from gossamer.protocols.blocktrain.coordinator import BlockCoordinatorRole
    from gossamer.protocols.blocktrain.server import BlockServerRole
    from gossamer.protocols.blocktrain.worker import BlockWorkerRole

    return {names.COORDINATOR: BlockCoordinatorRole, names.WORKER: BlockWorkerRole, names.SERVER: BlockServerRole, names.AR_STAGE: ArStageRole}


PLUGIN = ProtocolPlugin(
    name=names.PROTOCOL,
    summary="BlockTrain: denoiser blocks trained apart by volunteers, served across hosts",
    settings=settings,
    roles=(names.COORDINATOR, names.WORKER, names.SERVER, names.AR_STAGE,),
    load_roles=roles,
    owner_roles=(names.COORDINATOR,),
    swarm_roles=(names.WORKER,),
    commands=(SERVE, GENERATE),
    events=EVENTS,
    finish=FinishRule("finished", by="owner"),
    describe_event=describe,
    progress=progress,
    panel=panel,
)
