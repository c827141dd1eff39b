"""FoMoE's pure core (the method and a round: ``protocols/fomoe/README.md``; a role needs only ``__all__``):
``config`` ``MoEConfig``, ``FomoeConfig``; ``layer`` one MoE layer (routing, skip-token gather/scatter, the
balance loss); ``model`` ``MoETransformer``; ``layout`` ``ParamLayout``; ``placement`` who holds which expert;
``sync`` ``mix_round`` (robust rules, pair limits) and traffic counts; ``replica`` ``FomoeReplica``;
``simulation`` peers in one process; ``boundary`` a round's commits, agreement and next placement; ``errors``.
"""

from gossamer.protocols.fomoe.core.config import FomoeConfig, MoEConfig
from gossamer.protocols.fomoe.core.layout import ParamLayout
from gossamer.protocols.fomoe.core.model import ExpertKey, MoETransformer, Routing, build_moe_model, expert_of
from gossamer.protocols.fomoe.core.placement import (
    ExpertCoverage,
    Placement,
    Transfer,
    coverage,
    from_assignments,
    place_experts,
    replace_experts,
    transfers,
)
from gossamer.protocols.fomoe.core.replica import ExpertState, FomoeReplica, StepReport
from gossamer.protocols.fomoe.core.simulation import RoundReport, global_parameters, simulate_round
from gossamer.protocols.fomoe.core.sync import (
    FomoeUpdate,
    MixedRound,
    PairLimits,
    SyncBytes,
    addressed_to,
    all_to_all_bytes,
    clip_to_median_norm,
    data_parallel_bytes,
    median_norm,
    mix_round,
    plain_mean,
    robust_default,
    sync_bytes,
    token_weighted_mean,
    update_bytes,
    update_problem,
)

__all__ = [
    "ExpertCoverage", "ExpertKey", "ExpertState", "FomoeConfig", "FomoeReplica", "FomoeUpdate",
    "MixedRound", "MoEConfig", "MoETransformer", "PairLimits", "ParamLayout", "Placement", "RoundReport",
    "Routing", "StepReport", "SyncBytes", "Transfer", "addressed_to", "all_to_all_bytes", "build_moe_model",
    "clip_to_median_norm", "coverage", "data_parallel_bytes", "expert_of", "from_assignments",
    "global_parameters", "median_norm", "mix_round", "place_experts", "plain_mean", "replace_experts",
    "robust_default", "simulate_round", "sync_bytes", "token_weighted_mean",
    "transfers", "update_bytes", "update_problem",
]
