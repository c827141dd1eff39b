"""TL++ secure mode against a party that cheats (issue 21), with the live roles or the share
arithmetic: a helper that sorts first, a node that parks far-future shares, an orchestrator that
asks for sums over one node, forges logit gradients or reconstructs too small a batch, and a helper
reading the gradient off the weights (SECURITY.md, "TL++ secure mode: threat model")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from gossamer.crypto.identity import Identity
from gossamer.peer.errors import ConfigError
from gossamer.peer.kit.secure_link import LinkMessage, RequestRefused, SecureLinks
from gossamer.peer.run.records import PeerRecord
from gossamer.protocols.registry import PLUGINS
from gossamer.protocols.tlpp.core import (
    VirtualBatch,
    VirtualBatchScheduler,
    digits_cnn,
    logit_gradient,
    split_model,
)
from gossamer.protocols.tlpp.core.secure import gradient_layout, layout_numel, secure_step
from gossamer.protocols.tlpp.ledger import StepLedger
from gossamer.protocols.tlpp.settings import TlppSettings
from gossamer.protocols.tlpp.wire import ACT, FORWARD, GRADS, HELPER_METHOD, LOGITS, NODE_METHOD, SHARE, SUM
from gossamer_harness.localnet import LocalNet
from tests.protocols.tlpp.harness import Tlpp

SOURCES = [f"builtin:digits:shard={i}/3" for i in range(3)]
HYPER = {"mode": "secure", "batch_size": 48, "optimizer": "adam", "lr": 0.01, "steps": 4, "eval_every": 0,
         "min_nodes": 3, "node_timeout_s": 10.0, "helper_timeout_s": 5.0, "helper_wait_s": 0.5}
ROWS = 12  # per node in the hand-built batches: two nodes make 24 >= min_batch = 20


def batch_of(net: Tlpp, names: list[str], rows: int = ROWS) -> VirtualBatch:
    nodes = sorted(net.id_of(name) for name in names)
    return VirtualBatch(epoch=0, index=0, order=tuple((n, i) for n in nodes for i in range(rows)))


def links(net: Tlpp, identity: Identity) -> SecureLinks:
    return SecureLinks(identity=identity, run_id=net.manifest.run_id, view=net.view)


def act_share(rows: int) -> dict[str, torch.Tensor]:
    return {ACT: torch.randint(-2 ** 62, 2 ** 62, (rows, 64), dtype=torch.int64)}


# --- item 1: the helper is the pinned one ----------------------------------------------------------


async def test_a_helper_whose_id_sorts_first_is_never_used_and_the_nodes_refuse_it(tmp_path: Path) -> None:
    """Mallory grinds a key whose id sorts before the real helper's and publishes an admitted
    record with the helper role: the orchestrator still takes the pinned helper (it took
    ``sorted(...)[0]``), a node refuses a forward naming Mallory, and Mallory cannot even run the
    helper role of the run."""
    identities = {name: Identity.generate() for name in ["node0", "node1", "node2", "helper", "orchestrator"]}
    mallory = Identity.generate()
    while mallory.peer_id >= identities["helper"].peer_id:
        mallory = Identity.generate()
    net = await Tlpp.create(tmp_path, hyper=HYPER, sources=SOURCES, helper=True, identities=identities,
                            admit=(mallory,))
    net.outsider(mallory, PeerRecord(peer_id=mallory.peer_id, public_key=mallory.public_key, name="mallory",
                                     http_addr="", tcp_addr="127.0.0.1:1",
                                     roles=("helper",), version="x", round=0, timestamp=net.now()))
    as_owner = links(net, net.owner)
    try:
        assert sorted(p.record.peer_id for p in net.orchestrator.peers_with("helper"))[0] == mallory.peer_id
        assert await net.orchestrator._helper() == net.id_of("helper")
        fields = {"indices": [0, 1], "version": 0, "mode": "secure", "helper": mallory.peer_id}
        with pytest.raises(RequestRefused, match="trusts only its pinned helper") as refused:
            await as_owner.request(net.id_of("node0"), NODE_METHOD,
                                   LinkMessage(FORWARD, 0, fields, net.orchestrator.driver.weights()), timeout_s=10.0)
        assert refused.value.code == "helper" and net.peers["node0"].role.last_step == -1  # type: ignore[attr-defined]
        with pytest.raises(ConfigError, match="pins helper"):
            await net.add("mallory", ("helper",), identity=mallory)
    finally:
        await as_owner.aclose()
        await net.aclose()


async def test_a_data_node_joins_a_secure_run_only_pinned_to_the_helper_the_manifest_names(tmp_path: Path) -> None:
    net = await Tlpp.create(tmp_path, hyper=HYPER, sources=SOURCES[:1], helper=True)
    try:
        with pytest.raises(ConfigError, match="this data node trusts no helper; start it with `gossamer node"):
            await net.add("unpinned", ("node",), data=SOURCES[1])
        with pytest.raises(ConfigError, match="not the one you trust"):
            await net.add("elsewhere", ("node",), data=SOURCES[1], role_options={"node": {"helper": "ab" * 32}})
    finally:
        await net.aclose()
    base = await Tlpp.create(tmp_path / "base", hyper={**HYPER, "mode": "base"}, sources=[], helper=False)
    try:
        with pytest.raises(ConfigError, match="trains in base mode"):
            await base.add("pinned", ("node",), data=SOURCES[1], role_options={"node": {"helper": "ab" * 32}})
    finally:
        await base.aclose()


async def test_a_secure_run_that_admits_anyone_is_refused(tmp_path: Path) -> None:
    helper = Identity.generate()
    doc = {"run": {"name": "t", "protocol": "tlpp"}, "hyper": {**HYPER, "helper": helper.peer_id},
           "admission": {"policy": "open"}}
    net = await LocalNet.create(doc, plugins=PLUGINS, workdir=tmp_path)
    try:
        for name, roles in (("orchestrator", ("orchestrator", "tlpp-orchestrator")), ("helper", ("helper",))):
            with pytest.raises(ConfigError, match=re.escape('refuses admission.policy = "open"')):
                await net.add(name, roles, identity=net.owner if name == "orchestrator" else helper)
    finally:
        await net.aclose()


# --- item 7: the helper's share store cannot be filled ---------------------------------------------------


async def test_a_node_parking_far_future_shares_cannot_crowd_out_the_real_ones(tmp_path: Path) -> None:
    """node2, a live data node of the run, parks activation shares for 8 far-future steps (the
    helper used to keep any 8 steps and then refuse every real share as "full") and for every step
    of its window: the far-future ones are refused, its own window holds at most SHARE_WINDOW + 1
    steps, and node0's and node1's real steps train."""
    net = await Tlpp.create(tmp_path, hyper=HYPER, sources=SOURCES, helper=True)
    as_mallory, helper = links(net, net.identities["node2"]), net.peers["helper"].role
    try:
        for step in range(100, 108):
            with pytest.raises(RequestRefused, match="ahead of the window") as refused:
                await as_mallory.request(net.id_of("helper"), HELPER_METHOD,
                                         LinkMessage(SHARE, step, {"kind": "act", "party": 1}, act_share(4)),
                                         timeout_s=5.0)
            assert refused.value.code == "ahead"
        taken = []
        for step in range(4):
            try:
                await as_mallory.request(net.id_of("helper"), HELPER_METHOD,
                                         LinkMessage(SHARE, step, {"kind": "act", "party": 1}, act_share(4)),
                                         timeout_s=5.0)
                taken.append(step)
            except RequestRefused as exc:
                assert exc.code == "ahead"
        assert taken == [0, 1, 2]
        for step in range(3):
            ledger = StepLedger(step=step, epoch=0, index=0, mode="secure")
            grads = await net.orchestrator.driver.run(batch_of(net, ["node0", "node1"]), ledger, net.id_of("helper"))
            assert grads is not None and not ledger.rejected and len(ledger.used) == 2, (ledger.note, ledger.rejected)
        assert helper.store.steps_held <= 1  # type: ignore[attr-defined]  # the steps before the last one are gone
    finally:
        await as_mallory.aclose()
        await net.aclose()


# --- item 4: no sum over fewer than k nodes, no forged logit gradients, bounded logit queries ----------------


async def test_the_helper_reveals_no_sum_over_fewer_than_k_nodes_nor_outside_the_steps_logits(tmp_path: Path) -> None:
    """An orchestrator asking the helper for the sum over one node (it used to answer it, and the
    orchestrator reconstructed that node's own gradient), over a node that was not in the step's
    logits, for a second sum or a second logits of one step: all refused; a sum whose shares
    arrived from fewer than k nodes is answered without a share."""
    net = await Tlpp.create(tmp_path, hyper=HYPER, sources=SOURCES, helper=True)
    settings = net.settings
    numel = layout_numel(gradient_layout(*settings.split(settings.build_model("cpu"))))
    as_nodes = {name: links(net, net.identities[name]) for name in ("node0", "node1")}
    as_owner, helper = links(net, net.owner), net.id_of("helper")
    pair = sorted([net.id_of("node0"), net.id_of("node1")])
    weight = {"weight": net.orchestrator.driver.weights()["3.0.weight"]}

    async def owner(op: str, fields: dict, tensors: dict | None = None) -> LinkMessage:
        return await as_owner.request(helper, HELPER_METHOD, LinkMessage(op, 0, fields, tensors or {}), timeout_s=5.0)

    try:
        for links_ in as_nodes.values():
            await links_.request(helper, HELPER_METHOD, LinkMessage(SHARE, 0, {"kind": "act", "party": 1},
                                                                    act_share(ROWS)), timeout_s=5.0)
        with pytest.raises(RequestRefused, match="fewer than min_sum_nodes = 2"):
            await owner(LOGITS, {"nodes": pair[:1], "sizes": {pair[0]: ROWS}}, weight)
        logits = await owner(LOGITS, {"nodes": pair, "sizes": dict.fromkeys(pair, ROWS)}, weight)
        assert logits.fields["nodes"] == pair and logits.tensors["logits"].shape == (2 * ROWS, 10)
        with pytest.raises(RequestRefused, match="answers them once"):
            await owner(LOGITS, {"nodes": pair, "sizes": dict.fromkeys(pair, ROWS)}, weight)
        grads = {GRADS: torch.randint(-2 ** 62, 2 ** 62, (numel,), dtype=torch.int64)}
        await as_nodes["node0"].request(helper, HELPER_METHOD, LinkMessage(SHARE, 0, {"kind": "grad", "party": 1},
                                                                          grads), timeout_s=5.0)
        with pytest.raises(RequestRefused, match="fewer than min_sum_nodes = 2") as one:
            await owner(SUM, {"nodes": [net.id_of("node0")]})
        with pytest.raises(RequestRefused, match="were not in that step's logits") as outside:
            await owner(SUM, {"nodes": [net.id_of("node0"), net.id_of("node2")]})
        assert one.value.code == outside.value.code == "nodes"
        short = await owner(SUM, {"nodes": pair})  # node1's gradient share never came
        assert short.fields["nodes"] == [net.id_of("node0")] and "1 node(s), fewer than min_sum_nodes" in \
            short.fields["note"]
        assert not short.tensors
        with pytest.raises(RequestRefused, match="summed it already"):
            await owner(SUM, {"nodes": pair})
    finally:
        for links_ in [*as_nodes.values(), as_owner]:
            await links_.aclose()
        await net.aclose()


async def test_a_node_refuses_a_logit_gradient_that_is_not_its_own_and_a_second_forward_of_a_step(
        tmp_path: Path) -> None:
    """To isolate node A's gradient in a sum, an orchestrator would send the other nodes zero (or
    forged) logit gradients. Each node recomputes its own slice from the weights and labels it
    holds and refuses one that differs; it refuses a second forward of a step (each forward is a
    logit query through weights the orchestrator chooses) and a grad_scale below min_batch."""
    net = await Tlpp.create(tmp_path, hyper=HYPER, sources=SOURCES, helper=True)
    as_owner, node0 = links(net, net.owner), net.id_of("node0")
    role, model = net.peers["node0"].role, net.orchestrator.model
    indices = list(range(ROWS))
    fields = {"indices": indices, "version": 0, "mode": "secure", "helper": net.id_of("helper")}

    async def node(op: str, step: int, fields_: dict, tensors: dict) -> LinkMessage:
        return await as_owner.request(node0, NODE_METHOD, LinkMessage(op, step, fields_, tensors), timeout_s=10.0)

    with torch.no_grad():
        logits = model(role.data.x[indices]).double()  # type: ignore[attr-defined]
    _, own, _ = logit_gradient(logits, role.data.y[indices])  # type: ignore[attr-defined]
    batch = 2 * ROWS  # as if another node sent the other half of the batch
    own = (own * ROWS / batch).float()
    backward = {"grad_scale": float(batch), "helper": net.id_of("helper")}
    try:
        for step, (logit_grad, scale, match) in enumerate([
                (torch.zeros_like(own), batch, "logit_grad is not this node's own"),
                (own * 1.05, batch, "logit_grad is not this node's own"),
                (own[:-1], batch, "this node forwarded 12 samples"),
                (own, 19.0, r"grad_scale \(the step's samples\) must be a number in \[min_batch = 20")]):
            await node(FORWARD, step, fields, net.orchestrator.driver.weights())
            with pytest.raises(RequestRefused, match=match) as refused:
                await node("backward", step, {**backward, "grad_scale": float(scale)}, {"logit_grad": logit_grad})
            assert refused.value.code in ("gradient", "malformed")
        await node(FORWARD, 4, fields, {})
        with pytest.raises(RequestRefused, match="answers one forward per step") as again:
            await node(FORWARD, 4, fields, {})
        assert again.value.code == "step"
        answer = await node("backward", 4, backward, {"logit_grad": own})
        assert answer.fields["party"] == 0 and answer.tensors[GRADS].dtype == torch.int64
    finally:
        await as_owner.aclose()
        await net.aclose()


async def test_the_orchestrator_reconstructs_nothing_over_one_node(tmp_path: Path) -> None:
    net = await Tlpp.create(tmp_path, hyper=HYPER, sources=SOURCES, helper=True)
    try:
        ledger = StepLedger(step=0, epoch=0, index=0, mode="secure")
        assert await net.orchestrator.driver.run(batch_of(net, ["node0"], rows=24), ledger, net.id_of("helper")) is None
        assert ledger.note == "not run: 1 node(s), fewer than min_sum_nodes = 2" and not ledger.used
        assert ledger.rejected == {net.id_of("node0"): f"step: {ledger.note}"} and ledger.balance_problems() == []
        assert net.peers["helper"].role.logits_served == 0  # type: ignore[attr-defined]
    finally:
        await net.aclose()


# --- item 2: a batch too small to hide the activations is never revealed ----------------------------------


def test_the_summed_gradient_of_a_batch_below_num_classes_gives_the_orchestrator_the_activations() -> None:
    """Why secure mode has a minimum batch: the orchestrator knows G = dL/dlogits and learns
    dW = G^T A; with B <= num_classes - 1 samples G^T has full column rank and A = pinv(G^T) dW."""
    node_side, orchestrator_side = split_model(digits_cnn(seed=0), 3)
    g = torch.Generator().manual_seed(1)
    xs = {"a": torch.rand(3, 1, 8, 8, generator=g), "b": torch.rand(3, 1, 8, 8, generator=g)}
    ys = {"a": torch.tensor([0, 1, 2]), "b": torch.tensor([3, 4, 5])}  # distinct labels: G^T well conditioned
    step = secure_step(node_side, orchestrator_side, xs, ys, max_abs=48.0, max_failure=1e-4)
    _, grad, _ = logit_gradient(step.logits, torch.cat([ys["a"], ys["b"]]))
    solved = torch.linalg.pinv(grad.T.double()) @ step.grads["3.0.weight"].double()
    with torch.no_grad():
        true = node_side(torch.cat([xs["a"], xs["b"]])).double()
    cosine = torch.nn.functional.cosine_similarity(solved, true, dim=1)
    assert float(cosine.min()) > 0.999


async def test_a_batch_below_min_batch_is_never_revealed_whether_planned_or_shrunk_by_drop_outs(
        tmp_path: Path) -> None:
    net = await Tlpp.create(tmp_path, hyper=HYPER, sources=SOURCES, helper=True)
    driver, helper = net.orchestrator.driver, net.id_of("helper")
    net.fail("node1", 1, "backward")
    try:
        small = StepLedger(step=0, epoch=0, index=0, mode="secure")
        assert await driver.run(batch_of(net, ["node0", "node1"], rows=3), small, helper) is None
        assert small.note == "not run: 6 samples, fewer than min_batch = 20"
        assert net.peers["helper"].role.logits_served == 0  # type: ignore[attr-defined]
        shrunk = StepLedger(step=1, epoch=0, index=0, mode="secure")
        assert await driver.run(batch_of(net, ["node0", "node1"]), shrunk, helper) is None
        assert shrunk.rejected[net.id_of("node1")].startswith("backward: ")
        assert shrunk.note == "not summed: 1 node(s), fewer than min_sum_nodes = 2" and not shrunk.used
        # node0 completed but nothing was summed: rejected with the step's reason (the ledger
        # balances), and kept in the schedule
        assert shrunk.rejected[net.id_of("node0")] == f"step: {shrunk.note}" and driver.kept == {net.id_of("node0")}
        for ledger in (small, shrunk):
            assert ledger.balance_problems() == [], ledger.to_json()
        three = StepLedger(step=2, epoch=0, index=0, mode="secure")
        net.fail("node2", 2, "backward")
        assert await driver.run(batch_of(net, ["node0", "node1", "node2"], rows=8), three, helper) is None
        assert three.note == "not summed: 16 samples, fewer than min_batch = 20"
        assert net.peers["helper"].role.sums_served == 0  # type: ignore[attr-defined]
        assert (await net.orchestrator._schedule(3)).min_size == 20  # an epoch's tail below it is dropped
    finally:
        await net.aclose()


# --- item 3: the weights the helper receives -------------------------------------------------------------


def test_sgd_would_show_the_helper_the_gradient_so_secure_mode_refuses_it_and_adam_shows_its_first_sign() -> None:
    """The helper receives W every step. With SGD, (W_t - W_t+1) / lr is the summed affine-layer
    gradient, exactly; secure mode refuses SGD. With Adam, the first update is about -lr * sign(g):
    the sign of each coordinate of the first summed gradient (the leak SECURITY.md states)."""
    xs = {"a": torch.rand(12, 1, 8, 8), "b": torch.rand(12, 1, 8, 8)}
    ys = {n: torch.randint(0, 10, (12,)) for n in xs}
    for optimizer in ("sgd", "adam"):
        settings = TlppSettings(optimizer=optimizer, lr=0.01)
        model = settings.build_model("cpu")
        node_side, orchestrator_side = settings.split(model)
        step = secure_step(node_side, orchestrator_side, xs, ys, max_abs=48.0, max_failure=1e-4)
        before = orchestrator_side[0][0].weight.detach().clone()
        opt = settings.build_optimizer(model)
        for name, param in model.named_parameters():
            param.grad = step.grads[name].to(param.dtype)
        opt.step()
        seen = (before - orchestrator_side[0][0].weight.detach()) / settings.lr  # what the helper can compute
        true = step.grads["3.0.weight"]
        if optimizer == "sgd":
            torch.testing.assert_close(seen, true, rtol=1e-3, atol=1e-6)
        else:
            clear = true.abs() > 1e-4
            assert torch.equal(seen.sign()[clear], true.sign()[clear])
    with pytest.raises(ConfigError, match=re.escape('refuses hyper.optimizer = "sgd"')):
        TlppSettings(mode="secure", helper="ab" * 32, min_nodes=2, optimizer="sgd")


def test_the_schedule_drops_a_tail_shorter_than_min_size() -> None:
    scheduler = VirtualBatchScheduler({"a": 30, "b": 29}, batch_size=24, seed=0, min_size=20)
    assert [len(b.order) for b in scheduler.epoch(0)] == [24, 24]  # the tail of 11 is dropped
    kept = VirtualBatchScheduler({"a": 30, "b": 29}, batch_size=24, seed=0, min_size=10)
    assert [len(b.order) for b in kept.epoch(0)] == [24, 24, 11]
    assert scheduler.without(["b"]).min_size == 20
