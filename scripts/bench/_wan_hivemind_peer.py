"""One ``hivemind.Optimizer`` peer of ``wan_training.py`` (``--mode sync``: synchronous large
batch; ``local``: ``use_local_updates=True``), the gossamer learner's model, shard, batches and
AdamW; its DHT announces a ``WanProxy``; it prints JSON event lines as ``gossamer peer --events``."""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from gossamer.protocols.core.models import ModelConfig, build_model
from gossamer.protocols.core.text_data import (
    BatchSampler,
    evaluate,
    load_text,
    next_byte_loss,
    shard,
    split_text,
)


def emit(event: str, **fields) -> None:
    print(json.dumps({"event": event, "wall_time": time.time(), **fields}), flush=True)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("sync", "local"), required=True)
    parser.add_argument("--run_id", required=True)
    parser.add_argument("--host_port", type=int, required=True)
    parser.add_argument("--announce_port", type=int, required=True)
    parser.add_argument("--initial_peers", nargs="*", default=[])
    parser.add_argument("--model", type=json.loads, required=True, help="ModelConfig keys, JSON")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--shard", type=int, required=True)
    parser.add_argument("--num_shards", type=int, required=True)
    parser.add_argument("--sampler_seed", type=int, required=True)
    parser.add_argument("--batch_size", type=int, required=True)
    parser.add_argument("--target_batch_size", type=int, required=True)
    parser.add_argument("--inner_lr", type=float, required=True)
    parser.add_argument("--weight_decay", type=float, required=True)
    parser.add_argument("--betas", type=float, nargs=2, required=True)
    parser.add_argument("--grad_clip", type=float, required=True)
    parser.add_argument("--heldout_fraction", type=float, required=True)
    parser.add_argument("--eval_batches", type=int, required=True)
    parser.add_argument("--eval_every_s", type=float, required=True)
    parser.add_argument("--matchmaking_time_s", type=float, required=True)
    parser.add_argument("--averaging_timeout_s", type=float, required=True)
    return parser.parse_args()


def main() -> int:
    """Events: ``ready`` (maddrs), then after one line on stdin (the start, with the seconds to
    train) ``eval`` samples (held-out loss after a new epoch once ``--eval_every_s`` has passed,
    and at the end) and ``done`` with the time split: ``compute_s`` is forward + backward + every
    ``opt.step()`` that did not start a new epoch; one that starts an epoch counts as
    ``blocking_s`` (matchmaking, all-reduce, the global step)."""
    import hivemind

    args = parse()
    torch.set_num_threads(1)
    config = ModelConfig.from_dict(args.model)
    split = split_text(load_text("builtin:pydoc"), heldout_fraction=args.heldout_fraction)
    sampler = BatchSampler(shard(split.train, index=args.shard, count=args.num_shards), batch_size=args.batch_size,
                           context=config.context, generator=torch.Generator().manual_seed(args.sampler_seed))
    model = build_model(config, seed=args.seed, device="cpu")
    dht = hivemind.DHT(host_maddrs=[f"/ip4/127.0.0.1/tcp/{args.host_port}"],
                       announce_maddrs=[f"/ip4/127.0.0.1/tcp/{args.announce_port}"],
                       initial_peers=args.initial_peers, start=True)
    opt = hivemind.Optimizer(
        dht=dht, run_id=args.run_id, params=model.parameters(),
        optimizer=lambda params: torch.optim.AdamW(params, lr=args.inner_lr, betas=tuple(args.betas),
                                                   weight_decay=args.weight_decay),
        batch_size_per_step=args.batch_size, target_batch_size=args.target_batch_size,
        use_local_updates=args.mode == "local", matchmaking_time=args.matchmaking_time_s,
        averaging_timeout=args.averaging_timeout_s, verbose=False)
    try:
        emit("ready", maddrs=[str(m) for m in dht.get_visible_maddrs()])
        budget_s = float(sys.stdin.readline())  # the start (every peer of the arm is ready): seconds to train
        train(args, config, model, opt, sampler, split.heldout, budget_s)
    finally:
        opt.shutdown()
        dht.shutdown()
    return 0


def train(args, config, model, opt, sampler, heldout, budget_s: float) -> None:
    def sample_loss(epoch: int) -> float:
        started = time.monotonic()
        loss = evaluate(model, heldout, context=config.context, max_batches=args.eval_batches, device="cpu")
        emit("eval", heldout_loss=loss, epoch=epoch, steps=steps, eval_s=time.monotonic() - started)
        return time.monotonic() - started

    steps, compute_s, blocking_s, eval_s, epochs_started = 0, 0.0, 0.0, 0.0, 0
    began = last_eval = time.monotonic()
    while time.monotonic() - began < budget_s:
        started = time.monotonic()
        x, y = sampler.sample("cpu")
        loss = next_byte_loss(model(x), y)
        loss.backward()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        stepped = time.monotonic()
        epoch = opt.local_epoch
        opt.step()
        opt.zero_grad()
        ended = time.monotonic()
        steps += 1
        if opt.local_epoch == epoch:
            compute_s += ended - started
        else:
            compute_s += stepped - started
            blocking_s += ended - stepped
            epochs_started += 1
            if ended - last_eval >= args.eval_every_s:
                eval_s += sample_loss(opt.local_epoch)
                last_eval = time.monotonic()
    wall_s = time.monotonic() - began
    sample_loss(opt.local_epoch)  # after the budget: not part of wall_s
    emit("done", steps=steps, epochs=epochs_started, final_epoch=opt.local_epoch, compute_s=compute_s,
         blocking_s=blocking_s, eval_s=eval_s, wall_s=wall_s)


if __name__ == "__main__":
    sys.exit(main())
