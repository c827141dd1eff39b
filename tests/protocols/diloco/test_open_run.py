"""Free identities against real learners in an open run (issue 10), on ``peer.testing.localnet``:
two honest learners train two rounds and are tenured; then twenty fresh identities publish signed
learner records. Their records claiming round 0 must not pull the learners' median round, their
full-size messages must fill at most the share of an inbox left to new senders (an honest
neighbour's still gets in), and a joiner must adopt the honest learners' state, not the
higher-versioned one the new identities offer (served for real, with a matching digest)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import torch

from gossamer.crypto.identity import Identity
from gossamer.peer.kit.inbox import size_bytes
from gossamer.peer.kit.messaging import SignedMessenger
from gossamer.peer.kit.state_donor import StateDonor
from gossamer.peer.run.records import PeerRecord
from gossamer.peer.serving import donated_state, role_app
from gossamer.protocols.core.models import flat_parameters
from gossamer.protocols.diloco.learner import LearnerRole
from gossamer.protocols.registry import PLUGINS
from gossamer.transport.errors import TransportError
from gossamer.transport.http import HttpConfig
from gossamer.transport.http_server import HttpServer
from gossamer_harness.localnet import LocalNet

pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="module")]
ROUNDS = 2
TENURE_S = 60.0
SYBILS = 20
RUN = {
    "run": {"name": "open", "protocol": "diloco", "heartbeat_s": 30.0, "tenure_s": TENURE_S},
    "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "context": 32},
    "hyper": {"rounds": ROUNDS, "batch_size": 8, "eval_batches": 2, "min_learners": 2, "catch_up_rounds": 2,
              "w1_grace_s": 30.0, "w2_deadline_s": 30.0, "diloco": {"inner_steps": 4, "inner_lr": 0.003},
              "mixing": {"w1": "global", "w2": "global"}, "aggregator": {"name": "mean"}},
}


@dataclasses.dataclass
class OpenRun:
    net: LocalNet
    learners: list[LearnerRole]
    sybils: list[Identity]
    poison_donor: HttpServer


def sybil_record(identity: Identity, net: LocalNet, **changes) -> PeerRecord:
    record = PeerRecord(peer_id=identity.peer_id, public_key=identity.public_key, name="free", http_addr="",
                        tcp_addr="", roles=("learner",), version="x", round=0, timestamp=net.now())
    return dataclasses.replace(record, **changes)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def open_run(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[OpenRun]:
    net = await LocalNet.create(RUN, plugins=PLUGINS, workdir=tmp_path_factory.mktemp("open"))
    poison: HttpServer | None = None
    try:
        learners = [(await net.add(f"l{i}", ("learner",))).role for i in range(2)]
        await net.start()
        for role in learners:
            await role.drain()
        net.skip(TENURE_S)  # the two have been up for the tenure
        await net.publish()
        sybils = [Identity.generate() for _ in range(SYBILS)]
        # the last one also offers a poisoned state, one version ahead, for real (its digest matches)
        poisoned = {name: torch.full_like(t, 7.0) for name, t in flat_parameters(learners[0].replica.module).items()}
        donor = StateDonor(lambda: (ROUNDS + 1, poisoned))
        poison = await HttpServer.create(role_app([], donor), host="127.0.0.1", port=0, config=HttpConfig())
        for sybil in sybils[:-1]:
            net.outsider(sybil, sybil_record(sybil, net))
        offer = {"round": ROUNDS + 1, "http_addr": f"127.0.0.1:{poison.address[1]}", "state": await donated_state(donor)}
        net.outsider(sybils[-1], sybil_record(sybils[-1], net, **offer))
        yield OpenRun(net=net, learners=learners, sybils=sybils, poison_donor=poison)
    finally:
        if poison is not None:
            await poison.aclose()
        await net.aclose()


async def test_new_identities_claiming_round_zero_do_not_pull_the_median(open_run: OpenRun) -> None:
    for role in open_run.learners:
        assert len(role.peers_with("learner")) == SYBILS + 1  # they are live learners of the open run...

        target = role._out_of_step()

        assert target is None, f"{role.peer_id[:8]} would leave its round for {target}"  # ...but do not steer


async def test_new_identities_fill_at_most_their_share_of_an_inbox(open_run: OpenRun) -> None:
    net, (honest, neighbour) = open_run.net, open_run.learners
    params = flat_parameters(honest.replica.module)
    url = f"http://127.0.0.1:{net['l0'].http.address[1]}/diloco/params/{honest.round}"
    accepted = 0
    for sybil in open_run.sybils:
        messenger = SignedMessenger(identity=sybil, run_id=net.manifest.run_id, client=net.http_client, view=net.view,
                                    now=net.now, limits=HttpConfig().limits, max_body_bytes=HttpConfig().max_body_bytes)
        try:
            await messenger.send(url, recipient=honest.peer_id, round=honest.round, tensors=params)
            accepted += 1
        except TransportError:
            pass
    sent_by_neighbour = await neighbour.messenger.send(url, recipient=honest.peer_id, round=honest.round,
                                                       tensors=params)

    assert accepted < SYBILS, "every new identity's full-size message was kept"
    budget = honest.inbox.max_bytes
    assert budget is not None and accepted * size_bytes(params) <= budget // 2 < SYBILS * size_bytes(params)
    assert sent_by_neighbour > 0  # the tenured neighbour's message still got in
    assert honest.inbox.held_bytes <= budget


async def test_a_joiner_adopts_the_tenured_learners_state_not_the_new_identities(open_run: OpenRun) -> None:
    net = open_run.net
    name = f"joiner-{len(net.peers)}"
    joiner = (await net.add(name, ("learner",))).role
    try:
        await net.start(name)
        await joiner.drain()
    finally:  # the other tests of the module count the run's learners: it leaves as it came
        await net.kill(name)
        net.forget(name)

    honest = flat_parameters(open_run.learners[0].replica.module)
    adopted = flat_parameters(joiner.replica.module)
    assert joiner.round == ROUNDS
    assert all(torch.equal(honest[name], adopted[name]) for name in honest)
