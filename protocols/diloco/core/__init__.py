"""Gossip DiLoCo's pure core: a replica's rounds, the mixes, and their recomputation.

- ``replica``        inner AdamW phase, pseudo-gradients, the outer Nesterov step.
- ``mixing``         gossip topologies, the parameter mix W1 and the pseudo-gradient mix W2.
- ``learner_round``  one learner's round recomputed from the contributions it used.
- ``pacing``         a learner's W2 deadline and its fail-slow learners, from measured arrivals.
"""
