"""A declared model on 28x28 images through the real TL++ roles (in one process, over loopback TCP
and encrypted links): each node publishes only its per-channel counts and sums, the orchestrator
pools them into the model's input normalisation (the statistics of the union of the nodes' data),
base mode reproduces centralized training of the same declared, normalised model and secure mode
reproduces base mode; a node whose data does not fit the declared input refuses to start."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gossamer.crypto.identity import Identity
from gossamer.protocols.tlpp.core import VirtualBatchScheduler
from gossamer.protocols.tlpp.data import DataSourceError, load_data
from gossamer.protocols.tlpp.settings import TlppSettings
from tests.protocols.tlpp.harness import Tlpp, digits_28, drive

STAGES = [["conv 4", "relu", "maxpool 2"], ["conv 8", "relu", "maxpool 2"], ["flatten", "linear 16", "relu"],
          ["linear 10"]]
MODEL = {"stages": STAGES, "input_shape": [1, 28, 28], "num_classes": 10}
HYPER = {"batch_size": 24, "optimizer": "sgd", "lr": 0.1, "steps": 3, "eval_every": 0, "min_nodes": 3,
         "node_timeout_s": 10.0, "helper_timeout_s": 5.0, "helper_wait_s": 2.0}


def centralized(net: Tlpp, sources: list[str], settings: TlppSettings) -> dict[str, torch.Tensor]:
    """The same declared model, normalised with the union's statistics, trained with plain SGD on
    the virtual batches the orchestrator draws."""
    names = {net.id_of(f"node{i}"): i for i in range(len(sources))}
    data = {n: load_data(sources[i], input_shape=(1, 28, 28), num_classes=10) for n, i in names.items()}
    union = torch.cat([d.x for d in data.values()]).double()
    model = settings.build_model("cpu")
    settings.normalization(model).set(union.mean(dim=(0, 2, 3)).tolist(), union.std(dim=(0, 2, 3), unbiased=False).tolist())
    optimizer = torch.optim.SGD(model.parameters(), lr=HYPER["lr"])
    scheduler = VirtualBatchScheduler({n: len(d) for n, d in data.items()}, batch_size=HYPER["batch_size"], seed=0)
    for batch in scheduler.epoch(0)[:HYPER["steps"]]:
        picked = batch.by_node()
        optimizer.zero_grad()
        F.cross_entropy(model(torch.cat([data[n].x[i] for n, i in picked.items()])),
                        torch.cat([data[n].y[i] for n, i in picked.items()])).backward()
        optimizer.step()
    return model.state_dict()


async def test_a_declared_28x28_model_trains_with_pooled_normalisation_in_base_and_secure_mode(tmp_path: Path) -> None:
    """Base mode trains as centralized SGD; secure mode (which refuses SGD for its optimizer) pools
    the same normalisation and its driver computes the same gradients, applied here with SGD."""
    paths = digits_28(tmp_path)
    sources, data = paths[:3], {"normalize": "nodes", "test": paths[3]}
    ids = {name: Identity.generate() for name in ["node0", "node1", "node2", "helper", "orchestrator"]}
    hyper = {"base": {**HYPER, "mode": "base"}, "secure": {**HYPER, "mode": "secure", "optimizer": "adam"}}
    nets = {mode: await Tlpp.create(tmp_path / mode, hyper=hyper[mode], sources=sources, helper=mode == "secure",
                                    identities=ids, model=MODEL, data=data) for mode in ("base", "secure")}
    try:
        base, secure = nets["base"], nets["secure"]
        await base.orchestrator.start()
        await asyncio.wait_for(base.orchestrator.done.wait(), 60)
        assert base.orchestrator.finished and not base.orchestrator.error
        assert all(ledger.applied and len(ledger.used) == 3 for ledger in base.orchestrator.history)
        secure.orchestrator._scheduled = secure.orchestrator._nodes()  # what training starts with, then
        secure.orchestrator._normalize()  # the pooled normalisation
        await drive(secure, [(i, {"node0", "node1", "node2"}) for i in range(HYPER["steps"])], lr=HYPER["lr"])
        reference = centralized(base, sources, base.settings)
        for mode, net in nets.items():
            trained = net.orchestrator.model.state_dict()
            torch.testing.assert_close(trained["0.0.mean"], reference["0.0.mean"], rtol=0, atol=1e-6)
            torch.testing.assert_close(trained["0.0.std"], reference["0.0.std"], rtol=0, atol=1e-6)
            tolerance = 1e-5 if mode == "base" else 1e-3
            assert max(float((trained[k] - reference[k]).abs().max()) for k in reference) < tolerance, mode
            node = net.peers["node1"].role
            assert node.status()["assignment"]["tlpp_stats"]["count"] == len(node.data)  # type: ignore[attr-defined]
            assert torch.equal(node.node_side[0][0].std, trained["0.0.std"])  # type: ignore[attr-defined]
    finally:
        for net in nets.values():
            await net.aclose()


async def test_a_node_whose_data_does_not_fit_the_declared_input_refuses_to_start(tmp_path: Path) -> None:
    np.savez(tmp_path / "small.npz", x=np.zeros((5, 8, 8)), y=np.zeros(5, dtype=int))
    ok = digits_28(tmp_path)
    net = await Tlpp.create(tmp_path / "run", hyper={**HYPER, "mode": "base"}, sources=ok[:1], helper=False,
                            model=MODEL, data={"test": ok[3]})
    try:
        with pytest.raises(DataSourceError, match=r"x has shape \[5, 8, 8\]; this run's model takes x of shape "
                                                  r"\[N, 1, 28, 28\] or \[N, 28, 28\]"):
            await net.add("small", ("node",), data=str(tmp_path / "small.npz"))
    finally:
        await net.aclose()
