"""Generating over the network: ``BlockTrainClient`` runs the protocol's passes and generation with
the blocks on block servers (the same text as in one process, byte for byte, for the same weights
and seed); ``ArClient`` generates through the matched AR pipeline, one pass per byte."""

from __future__ import annotations

import torch

from gossamer.peer.errors import ConfigError
from gossamer.peer.route.client import RemoteRoute, RouteFailed
from gossamer.protocols.blocktrain.core import BlockTrainConfig, generation_steps, initial_noise, readout
from gossamer.protocols.blocktrain.stack import partial_stack


def draw(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> torch.Tensor:
    """Bytes from logits [..., vocab]: argmax at temperature 0, else sampled from the generator."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1).to(generator.device)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1).to(logits.device)


def check_request(prompt: bytes, new_bytes: int, temperature: float) -> None:
    if not prompt:
        raise ConfigError("prompt: must be at least one byte")
    if new_bytes < 0:
        raise ConfigError(f"new_bytes must be >= 0, got {new_bytes}")
    if not temperature >= 0:
        raise ConfigError(f"temperature must be >= 0, got {temperature}")


class BlockTrainClient:
    """Passes and generation over block servers: the client draws the noise and reads out with E."""

    def __init__(self, route: RemoteRoute, config: BlockTrainConfig, embedding: dict[str, torch.Tensor],
                 *, device: torch.device) -> None:
        self.route = route
        self.config = config
        self.stack = partial_stack(config, [], device=device)
        self.stack.load_embedding_state({name: t.to(device) for name, t in embedding.items()})
        self.passes = 0

    async def denoise_pass(self, context: torch.Tensor, *, generator: torch.Generator) -> torch.Tensor:
        """Logits [batch, T, vocab] after one remote pass (``protocols.blocktrain.core.denoise_pass``)."""
        z = initial_noise(self.config, tuple(context.shape), generator=generator, device=context.device)
        answer = await self.route.run({"z": z.to("cpu").contiguous(),
                                       "context": context.to("cpu").contiguous()})
        z = answer.get("z")
        if z is None or tuple(z.shape) != (*context.shape, self.config.d_model) or z.dtype != torch.float32:
            shapes = {k: tuple(v.shape) for k, v in answer.items()}
            raise RouteFailed(f"the last host answered {shapes}, not z of shape "
                              f"{(*context.shape, self.config.d_model)}")
        self.passes += 1
        return readout(self.stack, z.to(context.device))

    async def generate(self, prompt: bytes, *, new_bytes: int, passes: int, generator: torch.Generator,
                       temperature: float = 1.0) -> bytes:
        """``protocols.blocktrain.core.generate`` with remote passes."""
        check_request(prompt, new_bytes, temperature)
        if passes < 1:
            raise ConfigError(f"passes must be >= 1, got {passes}")
        steps = generation_steps(self.config, prompt, new_bytes=new_bytes, passes=passes,
                                 generator=generator, temperature=temperature, device=self.stack.embed.weight.device)
        try:
            window = next(steps)
            while True:
                window = steps.send(await self.denoise_pass(window, generator=generator))
        except StopIteration as done:
            return done.value


class ArClient:
    """Generation through the matched AR pipeline: one pass per byte."""

    def __init__(self, route: RemoteRoute, *, context: int, vocab: int) -> None:
        self.route = route
        self.context = context
        self.vocab = vocab
        self.passes = 0

    async def next_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        answer = await self.route.run({"tokens": tokens.to("cpu").contiguous()})
        logits = answer.get("logits")
        if logits is None or tuple(logits.shape) != (tokens.shape[0], self.vocab):
            shapes = {k: tuple(v.shape) for k, v in answer.items()}
            raise RouteFailed(f"the last stage answered {shapes}, not logits of shape "
                              f"{(tokens.shape[0], self.vocab)}")
        self.passes += 1
        return logits

    async def generate(self, prompt: bytes, *, new_bytes: int, generator: torch.Generator,
                       temperature: float = 1.0) -> bytes:
        check_request(prompt, new_bytes, temperature)
        sequence = list(prompt)
        for _ in range(new_bytes):
            window = torch.tensor([sequence[-self.context:]], dtype=torch.long)
            sequence.append(int(draw((await self.next_logits(window))[0], temperature, generator)))
        return bytes(sequence[len(prompt):])
