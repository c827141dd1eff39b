"""TL++ traversal learning against centralized, FedAvg and split learning, one class per node over 10
data nodes, the same sample budget per arm; bytes checked against the formulas (docs/EXPERIMENTS.md)::

    nice -n 10 .venv/bin/python scripts/experiments/tlpp.py [--dataset digits|fashion-mnist] [--quick] [--dtype float64]"""

from __future__ import annotations

import argparse
import copy
import multiprocessing
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from _common import RESULTS_DIR, set_up
from _tlpp_tasks import DATASETS, Task, accuracy, load_task

from gossamer.crypto.sharing import SharingError
from gossamer.protocols.tlpp.core import (
    VirtualBatchScheduler,
    affine_layer,
    full_sync_step_bytes,
    node_backward,
    node_forward,
    orchestrator_step,
    split_model,
    sum_grads,
    tlpp_secure_step_bytes,
    tlpp_step_bytes,
)
from gossamer.protocols.tlpp.core.secure import ByteLedger, secure_step
from gossamer.protocols.tlpp.data import DataSourceError
from gossamer_harness.report import machine, markdown_table, write_result

DEFAULT_ARMS = {"digits": ("centralized", "tlpp_cut1", "tlpp_cut2", "tlpp_cut3", "tlpp_secure_cut3", "fedavg",
                           "split_seq"),
                "fashion-mnist": ("centralized", "tlpp_cut1", "tlpp_cut3", "tlpp_secure_cut3", "fedavg", "split_seq")}


@dataclass(frozen=True, kw_only=True)
class Settings:
    batch_size: int = 50  # virtual batch B (FedAvg: B / nodes per node per local step)
    epochs: int = 30  # passes over the training split (drop_last: 28 steps each on digits)
    lr: float = 3e-3  # Adam learning rate, every arm
    local_steps: int = 10  # FedAvg E: local steps per round
    seeds: int = 3  # model init and data order: seeds 0 .. seeds-1
    max_abs: float = 48.0  # secure mode: bound on |cut activation| the nodes enforce
    max_failure: float = 2e-4  # secure mode: truncation failure bound per virtual batch (guard)


# --- arms ---------------------------------------------------------------------------------------------------


@dataclass
class ArmRun:
    accuracy: float
    steps: int
    counted_bytes: int = 0
    formula_bytes: int = 0
    skipped_steps: int = 0
    final: dict[str, torch.Tensor] | None = field(default=None, repr=False)  # the trained parameters


def _scheduler(task: Task, s: Settings, seed: int) -> VirtualBatchScheduler:
    return VirtualBatchScheduler({n: len(y) for n, y in task.ys.items()}, batch_size=s.batch_size, seed=seed,
                                 drop_last=True)


def _batches(task: Task, s: Settings, seed: int):
    scheduler = _scheduler(task, s, seed)
    for epoch in range(s.epochs):
        yield from scheduler.epoch(epoch)


def _apply(model: torch.nn.Module, opt: torch.optim.Optimizer, grads: dict[str, torch.Tensor]) -> None:
    for name, p in model.named_parameters():
        p.grad = grads[name].to(p)
    opt.step()


def centralized(task: Task, s: Settings, seed: int, device: torch.device) -> ArmRun:
    model = task.model(seed, device)
    opt, steps = torch.optim.Adam(model.parameters(), lr=s.lr), 0
    for batch in _batches(task, s, seed):
        xs, ys = task.batch(batch.by_node())
        opt.zero_grad()
        F.cross_entropy(model(torch.cat(list(xs.values()))), torch.cat(list(ys.values()))).backward()
        opt.step()
        steps += 1
    return ArmRun(accuracy(model, task), steps, final=_final(model))


def _numel(module: torch.nn.Module) -> int:
    """Elements of a module's weights as they travel: its state (parameters and buffers)."""
    return sum(t.numel() for t in module.state_dict().values())


def _params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _buffers(module: torch.nn.Module) -> int:
    return sum(b.numel() for b in module.buffers())


def _final(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def tlpp_base(task: Task, s: Settings, seed: int, device: torch.device, *, cut: int) -> ArmRun:
    model = task.model(seed, device)
    node_side, server_side = split_model(model, cut)
    local = {n: copy.deepcopy(node_side) for n in task.xs}  # each data node's own copy
    opt, ledger, run = torch.optim.Adam(model.parameters(), lr=s.lr), ByteLedger(), ArmRun(0.0, 0)
    cut_numel = node_forward(node_side, task.x_test[:1]).numel()
    for batch in _batches(task, s, seed):
        xs, ys = task.batch(batch.by_node())
        acts, labels = {}, {}
        for n in xs:
            local[n].load_state_dict(ledger.send("orchestrator", n, node_side.state_dict()))
            acts[n] = ledger.send(n, "orchestrator", node_forward(local[n], xs[n]))
            labels[n] = ledger.send(n, "orchestrator", ys[n])
        step = orchestrator_step(server_side, acts, labels)
        node_grads = [ledger.send(n, "orchestrator", node_backward(local[n], xs[n], ledger.send(
            "orchestrator", n, step.cut_grads[n]))) for n in xs]
        _apply(model, opt, sum_grads(node_grads) | step.orchestrator_grads)
        run.steps += 1
        run.formula_bytes += tlpp_step_bytes(batch_size=len(batch.order), cut_numel=cut_numel,
                                             node_numel=_params(node_side),
                                             buffer_numel=_buffers(node_side), active_nodes=len(xs), dtype=task.dtype)
    run.accuracy, run.counted_bytes, run.final = accuracy(model, task), ledger.total_bytes, _final(model)
    return run


def tlpp_secure(task: Task, s: Settings, seed: int, device: torch.device) -> ArmRun:
    model = task.model(seed, device)
    node_side, server_side = split_model(model, 3)
    opt, run = torch.optim.Adam(model.parameters(), lr=s.lr), ArmRun(0.0, 0)
    for batch in _batches(task, s, seed):
        xs, ys = task.batch(batch.by_node())
        try:
            step = secure_step(node_side, server_side, xs, ys, max_abs=s.max_abs, max_failure=s.max_failure)
        except SharingError as error:  # guard refusal or detected truncation failure: the step is skipped
            print(f"  secure step {run.steps} skipped: {error}", flush=True)
            run.skipped_steps += 1
            continue
        _apply(model, opt, step.grads)
        run.steps += 1
        run.counted_bytes += step.ledger.total_bytes
        run.formula_bytes += tlpp_secure_step_bytes(
            batch_size=len(batch.order), cut_numel=affine_layer(server_side).in_features, num_classes=10,
            node_numel=_params(node_side), orchestrator_numel=_numel(server_side),
            buffer_numel=_buffers(node_side), active_nodes=len(xs), dtype=task.dtype)
    run.accuracy, run.final = accuracy(model, task), _final(model)
    return run


def fedavg(task: Task, s: Settings, seed: int, device: torch.device) -> ArmRun:
    model = task.model(seed, device)
    nodes, ledger = sorted(task.xs), ByteLedger()
    local_batch = s.batch_size // len(nodes)
    total_steps = s.epochs * _scheduler(task, s, seed).steps_per_epoch
    rng = np.random.default_rng([seed, 1])
    weights = torch.tensor([len(task.ys[n]) for n in nodes], dtype=task.dtype, device=device)
    rounds = total_steps // s.local_steps
    for _ in range(rounds):
        uploads = []
        for n in nodes:
            local = copy.deepcopy(model)
            local.load_state_dict(ledger.send("server", n, model.state_dict()))
            opt = torch.optim.Adam(local.parameters(), lr=s.lr)
            for _ in range(s.local_steps):
                idx = torch.as_tensor(rng.choice(len(task.ys[n]), local_batch, replace=False), device=device)
                opt.zero_grad()
                F.cross_entropy(local(task.xs[n][idx]), task.ys[n][idx]).backward()
                opt.step()
            uploads.append(ledger.send(n, "server", local.state_dict()))
        model.load_state_dict({k: torch.einsum("n,n...->...", weights / weights.sum(),
                                                torch.stack([u[k] for u in uploads])) for k in uploads[0]})
    formula = rounds * full_sync_step_bytes(num_nodes=len(nodes), model_numel=_numel(model), dtype=task.dtype)
    return ArmRun(accuracy(model, task), rounds * s.local_steps, ledger.total_bytes, formula)


def split_sequential(task: Task, s: Settings, seed: int, device: torch.device, *, cut: int = 1) -> ArmRun:
    model = task.model(seed, device)
    node_side, server_side = split_model(model, cut)
    nodes, ledger, run = sorted(task.xs), ByteLedger(), ArmRun(0.0, 0)
    local = {n: copy.deepcopy(node_side) for n in nodes}
    node_opts = {n: torch.optim.Adam(local[n].parameters(), lr=s.lr) for n in nodes}
    server_opt = torch.optim.Adam(server_side.parameters(), lr=s.lr)
    total_steps, rng = s.epochs * _scheduler(task, s, seed).steps_per_epoch, np.random.default_rng([seed, 2])
    cut_numel, holder = node_forward(node_side, task.x_test[:1]).numel(), None
    while run.steps < total_steps:
        for n in nodes:
            if run.steps >= total_steps:
                break
            if holder is not None:  # the previous node hands over its node-side weights
                local[n].load_state_dict(ledger.send(holder, n, local[holder].state_dict()))
                run.formula_bytes += _numel(node_side) * task.dtype.itemsize
            holder, order = n, torch.as_tensor(rng.permutation(len(task.ys[n])), device=device)
            for idx in order.split(s.batch_size):
                if run.steps >= total_steps:
                    break
                x, y = task.xs[n][idx], task.ys[n][idx]
                step = orchestrator_step(server_side, {n: ledger.send(n, "server", node_forward(local[n], x))},
                                   {n: ledger.send(n, "server", y)})
                _apply(server_side, server_opt, step.orchestrator_grads)
                _apply(local[n], node_opts[n], node_backward(local[n], x, ledger.send("server", n,
                                                                                       step.cut_grads[n])))
                run.steps += 1
                run.formula_bytes += tlpp_step_bytes(batch_size=len(idx), cut_numel=cut_numel, node_numel=0,
                                                     active_nodes=0, dtype=task.dtype)
    node_side.load_state_dict(local[holder].state_dict())  # the final model: last holder's node side
    run.accuracy, run.counted_bytes = accuracy(model, task), ledger.total_bytes
    return run


ARMS: dict[str, Callable[..., ArmRun]] = {
    "centralized": centralized,
    "tlpp_cut1": lambda *a: tlpp_base(*a, cut=1),
    "tlpp_cut2": lambda *a: tlpp_base(*a, cut=2),
    "tlpp_cut3": lambda *a: tlpp_base(*a, cut=3),
    "tlpp_secure_cut3": tlpp_secure,
    "fedavg": fedavg,
    "split_seq": split_sequential,
}


# --- report -------------------------------------------------------------------------------------------------


def _distance(a: dict[str, torch.Tensor] | None, b: dict[str, torch.Tensor] | None) -> float | None:
    """The largest |a - b| over every parameter (None unless both runs kept their parameters)."""
    if a is None or b is None:
        return None
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def summarise(runs: dict[str, list[ArmRun]]) -> dict[str, dict]:
    """Per arm: accuracies, bytes, and (TL++ arms, when ``centralized`` ran) how far its trained
    parameters end from centralized training's, seed by seed."""
    out = {}
    reference = runs.get("centralized", [])
    for arm, rs in runs.items():
        gaps = [_distance(r.final, c.final) for r, c in zip(rs, reference, strict=False)] if arm != "centralized" else []
        accs = [r.accuracy for r in rs]
        steps = sum(r.steps for r in rs)
        out[arm] = {"accuracy": accs, "mean": statistics.fmean(accs),
                    "sd": statistics.stdev(accs) if len(accs) > 1 else 0.0,
                    "bytes_per_step": sum(r.counted_bytes for r in rs) / steps,
                    "formula_bytes_per_step": sum(r.formula_bytes for r in rs) / steps,
                    "bytes_match_formula": all(r.counted_bytes == r.formula_bytes for r in rs),
                    "steps": [r.steps for r in rs], "skipped_steps": [r.skipped_steps for r in rs],
                    "max_abs_param_diff_vs_centralized": [g for g in gaps if g is not None] or None}
    return out


def _gap(gaps: list[float] | None) -> str:
    return "-" if not gaps else f"{max(gaps):.1e}"


def render(summary: dict[str, dict], s: Settings, *, task: Task, full_sync: int, run_s: float) -> str:
    rows = [[arm, f"{100 * v['mean']:.2f}", f"{100 * v['sd']:.2f}", f"{v['bytes_per_step']:,.0f}",
             f"{v['formula_bytes_per_step']:,.0f}", "yes" if v["bytes_match_formula"] else "NO",
             f"{full_sync / v['bytes_per_step']:.1f}x" if v["bytes_per_step"] else "-",
             sum(v["skipped_steps"]), _gap(v["max_abs_param_diff_vs_centralized"])] for arm, v in summary.items()]
    samples = sum(len(y) for y in task.ys.values())
    return "\n\n".join([
        f"Dataset: {task.name} ({samples} training samples, input {list(task.input_shape)}), one class per node "
        f"(10 nodes), {len(task.y_test)} test samples, {str(task.dtype).removeprefix('torch.')}. Model stages: "
        f"{[list(stage) for stage in task.stages]}; normalisation {'pooled from the nodes' if task.normalization else 'none'}. "
        f"Settings: {asdict(s)}. Run time {run_s:.0f} s.",
        markdown_table(["arm", "test acc % (mean)", "SD", "bytes/step (counted)", "bytes/step (formula)",
                        "counted == formula", "full sync / arm", "skipped steps", "max param gap vs centralized"], rows),
        f"A step is one optimizer step of the global model on B = {s.batch_size} samples (FedAvg: one local "
        f"step of every node, {s.batch_size // 10} samples each, its round's bytes spread over its "
        f"E = {s.local_steps} steps). Full-model synchronisation every step (2 x nodes x model bytes) = "
        f"{full_sync:,} bytes; the 'full sync / arm' column divides it by the arm's counted bytes/step. "
        "'max param gap vs centralized': the largest difference of any trained parameter from centralized training "
        "with the same seed (largest over seeds; TL++ arms).",
    ])


@dataclass(frozen=True)
class Job:
    """What a worker process needs to run one (arm, seed): it loads the task itself."""

    dataset: str
    device: str
    dtype: str
    per_class: int
    settings: Settings

    def run(self, pair: tuple[str, int]) -> ArmRun:
        device = set_up(self.device)
        task = load_task(self.dataset, device=device, dtype=getattr(torch, self.dtype), per_class=self.per_class)
        arm, seed = pair
        return ARMS[arm](task, self.settings, seed, device)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", choices=DATASETS, default="digits")
    parser.add_argument("--quick", action="store_true", help="smoke run: 4 epochs (fashion-mnist: 1), 1 seed")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--seeds", type=int)
    parser.add_argument("--arms", help=f"comma-separated, of {list(ARMS)} (default: per dataset)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--per_class", type=int, default=1000, help="fashion-mnist: training images per class/node")
    parser.add_argument("--device", default="cpu", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes, one (arm, seed) each at a time")
    args = parser.parse_args(argv)
    before = machine()
    device = set_up(args.device)
    quick_epochs = 4 if args.dataset == "digits" else 1
    s = Settings(epochs=args.epochs or (quick_epochs if args.quick else Settings.epochs),
                 seeds=args.seeds or (1 if args.quick else Settings.seeds))
    arms = args.arms.split(",") if args.arms else list(DEFAULT_ARMS[args.dataset])
    if sorted(set(arms) - set(ARMS)):
        parser.error(f"--arms: unknown {sorted(set(arms) - set(ARMS))}; known: {list(ARMS)}")
    try:
        task = load_task(args.dataset, device=device, dtype=getattr(torch, args.dtype), per_class=args.per_class)
    except DataSourceError as exc:
        parser.error(str(exc))
    start, runs = time.perf_counter(), {}
    if args.jobs > 1:  # (arm, seed) runs in worker processes, each loading the task itself; same results
        job = Job(dataset=args.dataset, device=str(device), dtype=args.dtype, per_class=args.per_class, settings=s)
        pairs = [(arm, seed) for arm in arms for seed in range(s.seeds)]
        with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            done = dict(zip(pairs, pool.map(job.run, pairs), strict=True))
        runs = {arm: [done[arm, seed] for seed in range(s.seeds)] for arm in arms}
        for arm in arms:
            print(f"{arm}: {[round(r.accuracy, 4) for r in runs[arm]]}", flush=True)
    for arm in arms if args.jobs <= 1 else ():
        arm_start = time.perf_counter()
        runs[arm] = [ARMS[arm](task, s, seed, device) for seed in range(s.seeds)]
        print(f"{arm}: {[round(r.accuracy, 4) for r in runs[arm]]} ({time.perf_counter() - arm_start:.0f} s)",
              flush=True)
    summary = summarise(runs)
    full_sync = full_sync_step_bytes(num_nodes=10, model_numel=_numel(task.model(0, device)), dtype=task.dtype)
    markdown = render(summary, s, task=task, full_sync=full_sync, run_s=time.perf_counter() - start)
    print(markdown)
    name = "tlpp" + ("" if args.dataset == "digits" else f"_{args.dataset}") + \
        ("" if args.dtype == "float32" else f"_{args.dtype}") + ("_quick" if args.quick else "")
    write_result(RESULTS_DIR / f"{name}.json", {
                         "settings": asdict(s), "dataset": args.dataset, "dtype": args.dtype,
                         "per_class": args.per_class if args.dataset == "fashion-mnist" else None,
                         "stages": [list(stage) for stage in task.stages], "normalization": task.normalization,
                         "full_sync_step_bytes": full_sync, "run_s": time.perf_counter() - start, "arms": summary},
                 before=before, markdown=markdown, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
