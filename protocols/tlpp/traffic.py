"""Bytes on the wire per TL++ step (base and secure) and per full-model synchronisation: the
formulas the experiment compares its counted bytes with."""

from __future__ import annotations


def tlpp_step_bytes(*, batch_size: int, cut_numel: int, node_numel: int, active_nodes: int,
                    elem_bytes: int = 4, label_bytes: int = 8) -> int:
    """Bytes of one base-mode TL++ step (traversal learning's per-step traffic):
    B*a*e up (activations) + B*l up (labels) + B*a*e down (cut gradients)
    + n_a*P_n*e down (node-side weights) + n_a*P_n*e up (node-side gradients),
    with a = cut activation elements per sample, P_n = node-side parameters, n_a = nodes in the
    virtual batch, e = bytes per element, l = bytes per label."""
    return 2 * batch_size * cut_numel * elem_bytes + batch_size * label_bytes \
        + 2 * active_nodes * node_numel * elem_bytes


def tlpp_secure_step_bytes(*, batch_size: int, cut_numel: int, num_classes: int, node_numel: int,
                           server_numel: int, active_nodes: int, elem_bytes: int = 4, label_bytes: int = 8,
                           ring_bytes: int = 8) -> int:
    """Bytes of one secure-mode TL++ step (cut 3 arrangement of ``peer.roles.tlpp.secure``), r = ring
    element bytes, K = classes, P_s = server-side parameters:
    2*B*a*r (activation shares to both servers) + B*l (labels) + B*K*r (helper's logit share)
    + B*K*e (logit-gradient slices down) + n_a*(P_n + P_s)*e (node and server weights down)
    + P_s*e (server weights to the helper) + 2*n_a*(P_n + P_s)*r (gradient shares to both servers)
    + (P_n + P_s)*r (helper's summed gradient share to the orchestrator)."""
    params = node_numel + server_numel
    return (2 * batch_size * cut_numel * ring_bytes + batch_size * label_bytes
            + batch_size * num_classes * (ring_bytes + elem_bytes) + active_nodes * params * elem_bytes
            + server_numel * elem_bytes + 2 * active_nodes * params * ring_bytes + params * ring_bytes)


def full_sync_step_bytes(*, num_nodes: int, model_numel: int, elem_bytes: int = 4) -> int:
    """Bytes of one full-model synchronisation (FedAvg-style): every node downloads and uploads the
    whole model, 2*n*P*e. FedAvg with E local steps per round pays this once per E steps."""
    return 2 * num_nodes * model_numel * elem_bytes
