"""FoMoE: partial-expert replicas of an MoE LM, skip-token training, holder-only expert sync.

Every peer holds the dense layers and the routers of an MoE byte LM plus a resident subset of its
experts; each expert lives on r peers. In the H local steps of a round a peer runs only its
experts: a (token, expert) pair whose expert it does not hold is skipped (contributes zero, costs
nothing). At the end of the round the dense part goes through the DiLoCo outer step over all
peers, each expert only over its holders, weighted by the pairs each ran.
The method: "FoMoE: Breaking the Full-Replica Barrier with a Federation of MoEs" (arXiv 2606.19025).

Map of the package (a network role needs only what ``__all__`` names):

- ``config``      ``MoEConfig`` (the model, a ``ModelConfig`` with ``n_experts``, ``top_k``) and
                  ``FomoeConfig`` (r, the load-balancing weight, skip renormalisation).
- ``layer``       one mixture-of-experts layer: top-k routing, skip-token gather/scatter, the
                  load-balancing loss on the full router distribution.
- ``model``       ``MoETransformer`` (``ByteTransformer`` with MoE blocks; parameter names keep
                  ``protocols.core.models``' scheme), ``build_moe_model``, ``expert_of``.
- ``layout``      ``ParamLayout``: dense names, per-(block, expert) names, byte sizes.
- ``placement``   ``place_experts`` / ``replace_experts`` / ``transfers``: who holds what,
                  deterministic from the sorted live peer ids and the round; ``from_assignments``
                  (back from published resident sets), ``coverage`` (per expert, for status).
- ``sync``        ``FomoeUpdate``, ``mix_round`` (dense over all, experts over holders, robust
                  aggregators pluggable), ``update_problem`` (an update checked on arrival),
                  ``sync_bytes`` / ``all_to_all_bytes`` (exact traffic per round).
- ``replica``     ``FomoeReplica``: one peer's round (wraps ``protocols.diloco.core.replica.DilocoReplica``).
- ``simulation``  several peers in one process: ``simulate_round``, ``global_parameters``.

A peer's model still allocates every expert (those it does not hold are never run, trained,
sent or stepped, and go stale): the parameter names stay those of the whole model, so the DiLoCo
machinery and checkpoints need no special case. Freeing the memory of experts a peer does not
hold is left for later.

Vocabulary: an **expert** is index e of E, held in every block; a **unit** is (block, expert),
the piece that is averaged; a **pair** is one (token, expert) choice of a router; a peer's
**resident** set is the experts it holds.

Also: ``errors`` (``ExpertMessageRefused``) and ``boundary`` (a round's commit and its outcome, checked
as received).
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
    SyncBytes,
    addressed_to,
    all_to_all_bytes,
    data_parallel_bytes,
    mix_round,
    plain_mean,
    sync_bytes,
    token_weighted_mean,
    update_bytes,
    update_problem,
)

__all__ = [
    "ExpertCoverage", "ExpertKey", "ExpertState", "FomoeConfig", "FomoeReplica", "FomoeUpdate",
    "MixedRound", "MoEConfig", "MoETransformer", "ParamLayout", "Placement", "RoundReport", "Routing",
    "StepReport", "SyncBytes", "Transfer", "addressed_to", "all_to_all_bytes", "build_moe_model", "coverage",
    "data_parallel_bytes", "expert_of", "from_assignments", "global_parameters", "mix_round",
    "place_experts", "plain_mean", "replace_experts", "simulate_round", "sync_bytes", "token_weighted_mean",
    "transfers", "update_bytes", "update_problem",
]
