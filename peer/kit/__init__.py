"""What roles of different protocols share (a protocol's roles never import another's).

- ``messaging``    signed tensor messages over HTTP (``SignedMessenger``: send, request, receive).
- ``secure_link``  encrypted request/response links over TCP with a confirmed handshake (a package).
- ``conditions``   waits on an asyncio.Condition with a deadline that always give its lock back.
- ``inbox``        contributions other peers sent, per (kind, round, sender), bounded.
- ``ledger``       the one ledger (``Exchange``) and its bounded ``History``.
- ``rounds``       sending to several peers with the failures in the ledger, waiting only for
                   senders that are still live.
- ``checkpoint``   atomic safetensors checkpoints, read back only for the same run and format.
- ``state_tree``   a role's resumable state (optimizer, generators, counters) as checkpoint tensors.
- ``statesync``    downloading a replicated state in shards from several donors.
- ``state_donor``  serving this peer's state to joiners, one shard per request.
- ``state_join``   choosing donors for a joiner and downloading the run's state from them.
- ``download_events`` the ``downloading`` event's fields and how a plugin shows it (no torch)."""
