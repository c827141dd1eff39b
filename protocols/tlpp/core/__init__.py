"""TL++ traversal learning: virtual batches, the model split at the cut, and the exact gradient path.

Traversal learning (Batool et al., "Traversal Learning: A Lossless and Efficient Distributed
Learning Framework", 2025; TL++ is gossamer's name for it with the secure server path) trains one
model on data that stays on its **data nodes**. The **orchestrator** holds the master model and
its optimizer. A **virtual batch** is drawn from the global (node, local index) list, shuffled each
epoch with (seed, epoch), and grouped by node. One step (base mode):

1. the orchestrator sends each node of the batch the node-side weights (the stages below the
   **cut**);
2. each node runs them on its samples and sends the cut activations A_i and labels y_i;
3. the orchestrator concatenates them (nodes in sorted order), runs the server side, takes the
   mean cross-entropy over the WHOLE virtual batch and returns each node its slice dA_i of the
   cut gradient;
4. each node backpropagates dA_i and returns its node-side parameter gradients; the orchestrator
   SUMS them (each slice already carries the 1/B of the batch mean) and steps its optimizer.

The sum of the node gradients plus the server gradients is exactly the gradient of centralized
training on the same batch (a test checks it to 1e-10 in float64) as long as nothing below the
cut couples samples of a batch: BatchNorm there is refused (``check_node_side``), as is dropout
(the node recomputes its forward in step 4 and would draw a different mask).

Secure mode (``protocols.tlpp.core.secure``) needs the server side to be affine (``affine_server``) and
computes the loss from reconstructed logits with ``logit_gradient``.

The model is a **declared stack** of stages (``stages``: a small vocabulary of conv, pool,
norm-free residual blocks, flatten, linear and activations, checked against the input shape and
built from the run seed on every host) or a **built-in** (``builtins``: ``digits_cnn``,
``rgb_cnn``, ``tabular_mlp``, ``resnet_small``, themselves declarations). Inputs may be
normalised per channel from statistics the nodes reduce their data to (``normalize``).

Exactness holds in exact arithmetic; a float64 test checks it to 1e-10. In float32 the split and
the centralized runs add the same terms in a different order, so over hundreds of steps they
drift apart by round-off (EXPERIMENTS.md, Fashion-MNIST): the same accuracy "to the digit" is a
float64 promise.

**Modules.** ``stages`` (the vocabulary, ``infer_shapes``, ``build_stages``, ``check_secure``),
``builtins`` (``BUILTINS``, ``builtin_stages``), ``normalize`` (``channel_stats``,
``pool_stats``, ``Normalize``), ``schedule`` (``VirtualBatch``, ``VirtualBatchScheduler``),
``model`` (``digits_cnn``, the node-side checks, ``split_model``, ``affine_server``), ``step``
(node forward and backward, ``server_step``, ``sum_grads``, ``logit_gradient``), ``traffic``
(the byte formulas), ``errors`` (``TraversalError``). The public names are importable from this
package.

Also ``secure``: the secure mode's arithmetic on additive shares (orchestrator and helper halves).
"""

from gossamer.protocols.tlpp.core.builtins import BUILTINS, builtin_stages
from gossamer.protocols.tlpp.core.errors import TraversalError
from gossamer.protocols.tlpp.core.model import affine_server, check_node_side, digits_cnn, split_model
from gossamer.protocols.tlpp.core.normalize import (
    ChannelStats,
    Normalize,
    channel_stats,
    pool_stats,
    read_stats,
)
from gossamer.protocols.tlpp.core.schedule import VirtualBatch, VirtualBatchScheduler
from gossamer.protocols.tlpp.core.stages import (
    Declaration,
    build_stages,
    check_cut,
    check_secure,
    infer_shapes,
)
from gossamer.protocols.tlpp.core.step import (
    ServerStep,
    logit_gradient,
    node_backward,
    node_forward,
    server_step,
    sum_grads,
)
from gossamer.protocols.tlpp.core.traffic import full_sync_step_bytes, tlpp_secure_step_bytes, tlpp_step_bytes

__all__ = [
    "BUILTINS",
    "ChannelStats",
    "Declaration",
    "Normalize",
    "ServerStep",
    "TraversalError",
    "VirtualBatch",
    "VirtualBatchScheduler",
    "affine_server",
    "build_stages",
    "builtin_stages",
    "channel_stats",
    "check_cut",
    "check_node_side",
    "check_secure",
    "digits_cnn",
    "full_sync_step_bytes",
    "infer_shapes",
    "logit_gradient",
    "node_backward",
    "node_forward",
    "pool_stats",
    "read_stats",
    "server_step",
    "split_model",
    "sum_grads",
    "tlpp_secure_step_bytes",
    "tlpp_step_bytes",
]
