"""TL++ byte formulas against hand-counted traffic, with element sizes from the dtypes."""

from __future__ import annotations

import torch

from gossamer.protocols.tlpp.core import (
    full_sync_step_bytes,
    tlpp_secure_step_bytes,
    tlpp_step_bytes,
)


def test_byte_formulas() -> None:
    # 2*B*a*e + B*l + 2*n_a*P_n*e with B=10, a=256, P_n=160, n_a=3
    assert tlpp_step_bytes(batch_size=10, cut_numel=256, node_numel=160, active_nodes=3) == \
        2 * 10 * 256 * 4 + 10 * 8 + 2 * 3 * 160 * 4
    assert full_sync_step_bytes(num_nodes=10, model_numel=1000) == 80_000
    secure = tlpp_secure_step_bytes(batch_size=2, cut_numel=3, num_classes=4, node_numel=5, orchestrator_numel=6,
                                    active_nodes=1)
    assert secure == 2 * 2 * 3 * 8 + 2 * 8 + 2 * 4 * 12 + 11 * 4 + 6 * 4 + 2 * 11 * 8 + 11 * 8


def test_element_sizes_come_from_the_dtypes() -> None:
    assert tlpp_step_bytes(batch_size=10, cut_numel=256, node_numel=160, active_nodes=3, dtype=torch.float64,
                           label_dtype=torch.int32) == 2 * 10 * 256 * 8 + 10 * 4 + 2 * 3 * 160 * 8
    assert full_sync_step_bytes(num_nodes=10, model_numel=1000, dtype=torch.bfloat16) == 40_000
    wide = tlpp_secure_step_bytes(batch_size=2, cut_numel=3, num_classes=4, node_numel=5, orchestrator_numel=6,
                                  active_nodes=1, dtype=torch.float64)
    assert wide == 2 * 2 * 3 * 8 + 2 * 8 + 2 * 4 * 16 + 11 * 8 + 6 * 8 + 2 * 11 * 8 + 11 * 8


def test_buffers_go_down_with_the_weights_but_no_gradient_comes_back() -> None:
    plain = tlpp_step_bytes(batch_size=10, cut_numel=256, node_numel=160, active_nodes=3)
    assert tlpp_step_bytes(batch_size=10, cut_numel=256, node_numel=160, active_nodes=3, buffer_numel=2) == \
        plain + 3 * 2 * 4
    secure = dict(batch_size=2, cut_numel=3, num_classes=4, node_numel=5, orchestrator_numel=6, active_nodes=2)
    assert tlpp_secure_step_bytes(**secure, buffer_numel=2) == tlpp_secure_step_bytes(**secure) + 2 * 2 * 4
