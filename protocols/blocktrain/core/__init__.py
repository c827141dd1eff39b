"""BlockTrain: a byte-level LM split into B blocks, each a denoiser trained on its own noise band.

**Model.** ``BlockStack`` holds the shared byte embedding E (``embed``, [vocab, d_model]) and
``num_blocks`` denoisers. Block k is a small causal transformer that owns one band
[edges[k], edges[k+1]] of noise levels; the bands split a log-normal(p_mean, p_std) restricted to
sigma in [sigma_min, sigma_max] into equal-probability parts (``band_edges``; for the defaults and
B = 4: 1.000, 1.238, 1.623, 2.428, 10.000). Block 0 owns the lowest noise.

**Training block k** (``train_step``; nothing outside block k is touched). For context bytes x
[batch, T] and targets y (y_t = x_{t+1}): draw one sigma per sequence from block k's band, form the
noisy target embedding z = E[y] + sigma * eps and, with EDM preconditioning (sigma_d = sigma_data),
c_skip = sigma_d^2 / (sigma^2 + sigma_d^2), c_out = sigma sigma_d / sqrt(sigma^2 + sigma_d^2),
c_in = 1 / sqrt(sigma^2 + sigma_d^2), c_noise = ln(sigma) / 4::

    F = block_k(x, c_in z, c_noise)     # position t sees x_<=t and z_<=t only (causal mask)
    D = c_skip z + c_out F              # denoised estimate
    loss = mean over sequences of lambda(sigma) * CE(D E^T, y),  lambda = (sigma^2 + sigma_d^2) / (sigma sigma_d)^2

z_t' for t' <= t are noisy copies of bytes x_<=t+1, so no position sees a byte it must predict.
Inside a block: its own context embedding and positions, a noise-level embedding of c_noise, and
z read as *evidence* p(y | z) = softmax(z E^T / sigma^2) (the Bayes posterior of the byte from z
alone, a function of c_in z and c_noise); F also has a noise-dependent linear path from c_in z.
Reading z through the evidence matters: fed raw, the noise in z dominates a fresh block's input.

**Shared embedding.** The rows of E have L2 norm sigma_data (``target_embedding`` rescales them,
so E's scale never drifts). With d_model = 128 this keeps the bands honest: at sigma = 1 the
noisy target tells little about the byte (the blocks must still model the context), while at
sigma = 0.002 it gives the byte away (the target-leakage failure). Default ``embedding =
"frozen"``: E is drawn from the run seed and never trained, so every worker of every block derives
the same E without exchanging it, a step touches exactly one block, and no block's targets move
under another block's feet. ``"averaged"``: E is also in every block's optimizer (through the
logits; z and the evidence use E detached) and the network averages the copies across all block
workers (``embedding_state`` / ``load_embedding_state``).

**Inference** (``inference``): one pass runs the blocks from B-1 (highest band) down to 0,
each taking ONE Euler step of the probability-flow ODE on every position at once, from
sigma_max * N(0, I) to the logits of every position. **Generation** commits one more byte per
pass over a segment of up to context // 2 new bytes; ``passes >=`` the segment length is
exact autoregressive sampling.

**Modules.** ``config`` (``BlockTrainConfig``), ``errors`` (``BlockTrainError``, the argument
checks), ``bands`` (noise bands, sigma sampling, EDM coefficients, loss weight), ``model`` (the
denoisers, ``BlockStack``, building and loading, ``target_embedding``, ``denoise``), ``train``
(``block_loss``, ``train_step``, ``heldout_ce``), ``inference`` (initial noise, the Euler step,
readout, ``denoise_pass``, generation), ``assignment`` (which worker trains which block),
``versioning`` (the next version of a block from its workers' updates). The public names are
importable from this package.

**Errors.** One type, ``BlockTrainError`` (a ``ProtocolError`` and a ``ValueError``), whose message
names the field or value.
"""

from gossamer.protocols.blocktrain.core.bands import (
    EdmCoefficients,
    band_edges,
    edm_coefficients,
    loss_weight,
    sample_sigma,
)
from gossamer.protocols.blocktrain.core.config import EMBEDDINGS, BlockTrainConfig
from gossamer.protocols.blocktrain.core.errors import BlockTrainError
from gossamer.protocols.blocktrain.core.inference import (
    PLACEHOLDER_BYTE,
    denoise_pass,
    denoise_step,
    generate,
    generation_steps,
    initial_noise,
    readout,
    update_segment,
)
from gossamer.protocols.blocktrain.core.model import (
    BlockStack,
    block_parameters,
    build_stack,
    denoise,
    target_embedding,
)
from gossamer.protocols.blocktrain.core.train import BlockLoss, block_loss, heldout_ce, train_step
from gossamer.protocols.blocktrain.core.versioning import mean_update, next_block, next_embedding

__all__ = [
    "EMBEDDINGS",
    "PLACEHOLDER_BYTE",
    "BlockLoss",
    "BlockStack",
    "BlockTrainConfig",
    "BlockTrainError",
    "EdmCoefficients",
    "band_edges",
    "block_loss",
    "block_parameters",
    "build_stack",
    "denoise",
    "denoise_pass",
    "denoise_step",
    "edm_coefficients",
    "generate",
    "generation_steps",
    "heldout_ce",
    "initial_noise",
    "loss_weight",
    "mean_update",
    "next_block",
    "next_embedding",
    "readout",
    "sample_sigma",
    "target_embedding",
    "train_step",
    "update_segment",
]
