"""Gossip DiLoCo's pure core (sans-I/O): ``replica`` (the config, the inner AdamW phase, the outer
Nesterov step), ``mixing`` (topologies, the mixing plan, the mix over what arrived), ``aggregate``
(the W1 mix, the W2 mix through a robust aggregator, ``--attack``), ``learner_round`` (a round
recomputed from what it used) and ``pacing`` (the W2 deadline, fail-slow learners, each wait)."""
