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

Secure mode (``peer.roles.tlpp.secure``) needs the server side to be affine (``affine_server``) and
computes the loss from reconstructed logits with ``logit_gradient``.

**Modules.** ``schedule`` (``VirtualBatch``, ``VirtualBatchScheduler``), ``model`` (``digits_cnn``,
the node-side checks, ``split_model``, ``affine_server``), ``step`` (node forward and backward,
``server_step``, ``sum_grads``, ``logit_gradient``), ``traffic`` (the byte formulas), ``errors``
(``TraversalError``). The public names are importable from this package.
"""

from gossamer.protocols.tlpp.errors import TraversalError
from gossamer.protocols.tlpp.model import affine_server, check_node_side, digits_cnn, split_model
from gossamer.protocols.tlpp.schedule import VirtualBatch, VirtualBatchScheduler
from gossamer.protocols.tlpp.step import (
    ServerStep,
    logit_gradient,
    node_backward,
    node_forward,
    server_step,
    sum_grads,
)
from gossamer.protocols.tlpp.traffic import full_sync_step_bytes, tlpp_secure_step_bytes, tlpp_step_bytes

__all__ = [
    "ServerStep",
    "TraversalError",
    "VirtualBatch",
    "VirtualBatchScheduler",
    "affine_server",
    "check_node_side",
    "digits_cnn",
    "full_sync_step_bytes",
    "logit_gradient",
    "node_backward",
    "node_forward",
    "server_step",
    "split_model",
    "sum_grads",
    "tlpp_secure_step_bytes",
    "tlpp_step_bytes",
]
