"""Shared sans-I/O code: tensors in, tensors out; no asyncio, sockets, clock or global RNG
(README.md here is the spec of what follows).

- ``errors``      the exception tree of every protocol's core.
- ``settings``    the one settings mechanism: bounds, tables and help declared on the fields.
- ``models``      the byte-level causal transformer LM the text protocols share.
- ``text_data``   built-in and local text, the fixed held-out split, shards, batches, evaluation;
                  ``TextRun``, the data and batch settings every text-LM run repeats.
- ``pacing``      deadlines that follow the live peers' measured times; fail-slow detection.
- ``consensus``   how far replicas disagree (consensus distance, contraction of a mixing matrix).
- ``robust``      Byzantine-robust aggregators over (arrived, failures) and their registry.
- ``attacks``     what Byzantine peers send (sign flip, ALIE, IPM, adaptive attacks, ...)."""
