"""BlockTrain's pure code (sans-I/O): the model, its training, inference and the coordinator's decisions.

- ``config``      ``BlockTrainConfig``: the stack's shape and noise schedule (the ``[model]`` table)
- ``errors``      ``BlockTrainError`` (a bad tensor, argument or state) and the call-time checks
- ``bands``       the noise bands, sigma sampling within a band, EDM coefficients, the loss weight
- ``model``       ``BlockStack`` (E and one denoiser per band), building, loading, ``denoise``
- ``train``       ``block_loss``, ``train_step`` (one block only), ``heldout_ce``
- ``inference``   initial noise, the Euler step, readout, ``denoise_pass``, segment-wise generation
- ``assignment``  which worker trains which block (``assign_blocks``)
- ``versioning``  a block's next version from its workers' updates

The method and the formulas: ``protocols/blocktrain/README.md``. The public names import from here.
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
