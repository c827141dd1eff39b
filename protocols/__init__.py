"""Pure protocol code: tensors in, tensors (or actions to send) out. No I/O, no asyncio, no clock,
no global RNG; ``now`` and generators are parameters. Imports nothing of gossamer's but itself.

Map of the package:

- ``errors``     ProtocolError > InvalidSetting, NotEnoughUpdates.
- ``tables``     manifest tables into settings dataclasses, unknown keys refused.
- ``models``     the byte-level causal transformer LM every text protocol reuses;
- ``text_data``  built-in text (``builtin:pydoc``) and local files, fixed held-out split, per-peer
                 shards, batch sampling and held-out evaluation.
- ``diloco``     inner AdamW phase, pseudo-gradients, outer Nesterov step (momentum per replica).
- ``mixing``     gossip topologies and the factored update (non-blocking parameter mix W1, blocking
                 pseudo-gradient mix W2 on a parameter subset), renormalised over what arrived;
                 a periodic exact average.
- ``learner_round`` one gossip-DiLoCo learner's round recomputed from the contributions it used
                 (what the fault tests compare a survivor's applied round with).
- ``consensus``  how far replicas disagree: consensus distance per parameter group, norms, the
                 contraction factor of a mixing matrix.
- ``robust``     Byzantine-robust aggregators over (arrived, failures), the registry and
                 ``build_aggregator``; ``robust_base`` (contributions, sanitize, flatten),
                 ``robust_kernels`` (vectorised order statistics and distances),
                 ``robust_clipping`` (centered clipping, worker momentum, clipped gossip);
                 ``attacks`` beside it (sign flip, ALIE, IPM, label flip, ...).
- ``context``    compressed context parallelism: ring attention whose keys and values travel as
                 subspace coefficients; each ring member's step as a sans-I/O state machine, the
                 coefficient message format and its checks (a subpackage; see its docstring).
- ``blocktrain`` BlockTrain (a subpackage): ``config``, ``bands`` (equal-probability noise bands,
                 EDM), ``model`` (blocks as denoisers, the stack), ``train`` (the one-block
                 training step), ``inference`` (one Euler step per block in a pass,
                 generation), ``assignment`` (which worker trains which block).
- ``fomoe``      FoMoE: an MoE LM whose peers hold a subset of its experts, skip the tokens routed
                 elsewhere, and average each expert only among its holders.
- ``pacing``     deadlines that follow the measured times of the live peers (a quantile times a
                 margin, the configured deadline as ceiling) and fail-slow detection.
- ``tlpp``       TL++ traversal learning (a subpackage): ``schedule`` (virtual batches grouped by
                 node), ``model`` (the model split at the cut), ``step`` (the exact, summed
                 gradient path), ``traffic`` (the byte formulas).

Vocabulary: a **round** is one outer step (a BlockTrain block version, a TL++ virtual batch); a **contribution** is what one peer sent for a round.
"""
