"""Bytes on the wire per TL++ step (base and secure) and per full-model synchronisation: the
formulas the experiment compares its counted bytes with. Element sizes come from the dtypes
(``dtype`` of activations, gradients and weights; ``label_dtype`` of the labels); secure mode's
shares are elements of Z_2^64, ``RING_BYTES`` each."""

from __future__ import annotations

import torch

RING_BYTES = 8  # one share: an element of Z_2^64 (int64 on the wire)


def tlpp_step_bytes(*, batch_size: int, cut_numel: int, node_numel: int, active_nodes: int, buffer_numel: int = 0,
                    dtype: torch.dtype = torch.float32, label_dtype: torch.dtype = torch.int64) -> int:
    """Bytes of one base-mode TL++ step (traversal learning's per-step traffic):
    B*a*e up (activations) + B*l up (labels) + B*a*e down (cut gradients)
    + n_a*(P_n + S_n)*e down (node-side weights and buffers) + n_a*P_n*e up (node-side gradients),
    with a = cut activation elements per sample, P_n = node-side parameters, S_n = node-side
    buffers (the input normalisation's mean and std; 0 without one), n_a = nodes in the virtual
    batch, e = bytes per element of ``dtype``, l = bytes per label of ``label_dtype``."""
    e, label_bytes = dtype.itemsize, label_dtype.itemsize
    return (2 * batch_size * cut_numel * e + batch_size * label_bytes
            + active_nodes * (2 * node_numel + buffer_numel) * e)


def tlpp_secure_step_bytes(*, batch_size: int, cut_numel: int, num_classes: int, node_numel: int,
                           orchestrator_numel: int, active_nodes: int, buffer_numel: int = 0,
                           dtype: torch.dtype = torch.float32, label_dtype: torch.dtype = torch.int64) -> int:
    """Bytes of one secure-mode TL++ step (cut 3 arrangement of ``protocols.tlpp.core.secure``), r = ring
    element bytes, K = classes, P_s = orchestrator-side parameters, e, l and S_n as in ``tlpp_step_bytes``:
    2*B*a*r (activation shares to both parties) + B*l (labels) + B*K*r (helper's logit share)
    + B*K*e (logit-gradient slices down) + n_a*(P_n + S_n + P_s)*e (node and orchestrator-side weights down)
    + P_s*e (orchestrator-side weights to the helper) + 2*n_a*(P_n + P_s)*r (gradient shares to both parties)
    + (P_n + P_s)*r (helper's summed gradient share to the orchestrator)."""
    e, label_bytes, r = dtype.itemsize, label_dtype.itemsize, RING_BYTES
    params = node_numel + orchestrator_numel
    return (2 * batch_size * cut_numel * r + batch_size * label_bytes + batch_size * num_classes * (r + e)
            + active_nodes * (params + buffer_numel) * e + orchestrator_numel * e + 2 * active_nodes * params * r
            + params * r)


def full_sync_step_bytes(*, num_nodes: int, model_numel: int, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of one full-model synchronisation (FedAvg-style): every node downloads and uploads the
    whole model, 2*n*P*e. FedAvg with E local steps per round pays this once per E steps."""
    return 2 * num_nodes * model_numel * dtype.itemsize
