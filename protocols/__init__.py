"""The training methods: one folder per protocol, its pure ``core`` beside its roles and README.

- ``core``        shared sans-I/O code every protocol uses (errors, settings, models, text data,
                  pacing, consensus, robust aggregation and attacks).
- ``none``        membership only; ``diloco`` gossip DiLoCo; ``blocktrain`` BlockTrain; ``tlpp``
                  TL++ traversal learning; ``context`` compressed context parallelism; ``fomoe``
                  FoMoE partial-expert replicas.
- ``registry``    the one list of plugins (``PLUGINS``), read by the CLI alone.
"""
