"""The composition root: the peer daemon, its CLI, configuration, roles, checkpoints and metrics.

Vocabulary (one word per concept, used everywhere in gossamer):

- **peer**: one daemon process with one Ed25519 identity; **peer id**: hex fingerprint of its
  public key (not hivemind's libp2p PeerID, which only addresses the DHT node).
- **run**: one training job; **run id** = ``<name>@<owner fingerprint prefix>``.
- **manifest**: the run's signed description, published in the DHT and over HTTP.
- **role**: what a peer does in a run (learner, block-worker, block-server, expert-host, cp-shard,
  node, orchestrator, helper).
- **round**: one synchronisation period of a protocol.
"""
