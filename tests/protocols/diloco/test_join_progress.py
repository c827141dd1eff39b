"""A learner joining mid-run says how far its state download is before it says it adopted the
state: one ``diloco.downloading`` event once the index is verified and one after every verified
shard (one shard per donor), which a hand-started peer prints as a progress bar."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from gossamer.peer.progress import Progress
from gossamer.protocols.core.models import flat_parameters
from gossamer.protocols.registry import PLUGINS
from gossamer_harness.localnet import LocalNet

pytestmark = pytest.mark.timeout(240)
ROUNDS = 2
RUN = {
    "run": {"name": "joining", "protocol": "diloco", "heartbeat_s": 30.0},
    "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "context": 32},
    "hyper": {"rounds": ROUNDS, "batch_size": 8, "eval_batches": 2, "min_learners": 2, "w1_grace_s": 30.0,
              "w2_deadline_s": 30.0, "diloco": {"inner_steps": 4, "inner_lr": 0.003},
              "mixing": {"w1": "global", "w2": "global"}, "aggregator": {"name": "mean"}},
}


async def test_a_joiner_reports_its_state_download_shard_by_shard_before_it_adopts(tmp_path: Path) -> None:
    net = await LocalNet.create(RUN, plugins=PLUGINS, workdir=tmp_path)
    events: list[tuple[str, dict[str, Any]]] = []

    def on_event(peer: str, event: str, fields: Mapping[str, Any]) -> None:
        if peer == "joiner":
            events.append((event, dict(fields)))

    net.watchers.append(on_event)
    try:
        donors = [(await net.add(f"l{i}", ("learner",))).role for i in range(2)]
        await net.start("l0", "l1")
        await asyncio.wait_for(asyncio.gather(*(role.drain() for role in donors)), timeout=200)  # a stable state
        await net.publish()
        await net.add("joiner", ("learner",))
        await net.start("joiner")  # joining mid-run: the download happens here
    finally:
        await net.aclose()

    kinds = [event for event, _ in events]
    assert kinds[:4] == ["diloco.downloading"] * 3 + ["diloco.adopted"], kinds
    progress = [fields for _, fields in events[:3]]
    total = progress[0]["total_bytes"]
    assert total > 0 and all(p["version"] == ROUNDS and p["shards"] == 2 and p["total_bytes"] == total
                             for p in progress)
    assert [p["shards_done"] for p in progress] == [0, 1, 2]
    assert progress[0]["done_bytes"] == 0 < progress[1]["done_bytes"] < progress[2]["done_bytes"] == total
    assert events[3][1]["round"] == ROUNDS and events[3][1]["donors"] == 2

    lines = Progress(PLUGINS.plugin("diloco"))
    first, last = (lines.line("diloco.downloading", p) for p in (progress[0], progress[2]))
    assert first is not None and first.startswith("[--------------------] 0/2  downloading the run's state at round 2")
    assert last is not None and last.startswith("[####################] 2/2  downloading the run's state at round 2")
    assert f"{total / 1e6:.1f} of {total / 1e6:.1f} MB verified" in last


class _Heard(logging.Handler):
    """Sets ``event`` when a log record containing ``text`` is emitted."""

    def __init__(self, text: str, event: asyncio.Event) -> None:
        super().__init__()
        self.text, self.event = text, event

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


async def test_a_joiner_whose_donors_moved_past_their_records_tries_again_once_the_records_change(
        tmp_path: Path) -> None:
    """Records lag the rounds they describe (a DHT store takes a while on a loaded host, and a
    round can be shorter): the donors' records offer round 2 while they already hold round 3. The
    joiner's download fails, it waits for the records to change and adopts round 3, instead of
    starting from round 0 (an e2e joiner under the CPU hog did, its first round event at round 0)."""
    net = await LocalNet.create(RUN, plugins=PLUGINS, workdir=tmp_path)
    retrying = asyncio.Event()
    heard = _Heard("trying again once the records change", retrying)
    logger = logging.getLogger("gossamer.protocols.diloco.learner")
    level = logger.level
    logger.addHandler(heard)
    logger.setLevel(logging.INFO)
    try:
        donors = [(await net.add(f"l{i}", ("learner",))).role for i in range(2)]
        await net.start("l0", "l1")
        await asyncio.wait_for(asyncio.gather(*(role.drain() for role in donors)), timeout=200)
        joiner = (await net.add("joiner", ("learner",))).role  # every record published: round 2
        for role in donors:  # then the donors move on to round 3, their records not yet republished
            version, params = role.model_state()
            role._snapshot = (version + 1, {name: tensor + 1.0 for name, tensor in params.items()})
        starting = asyncio.create_task(net.start("joiner"))
        await asyncio.wait_for(retrying.wait(), timeout=60)
        assert not starting.done() and joiner.replica.round == 0
        await net.publish()  # the records catch up: round 3
        await asyncio.wait_for(starting, timeout=60)
        assert joiner.replica.round == ROUNDS + 1
        adopted = flat_parameters(joiner.replica.module)
        assert all(torch.equal(adopted[name], tensor) for name, tensor in donors[0].model_state()[1].items())
    finally:
        logger.removeHandler(heard)
        logger.setLevel(level)
        await net.aclose()
