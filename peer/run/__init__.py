"""Who is in the run.

- ``manifest``   run configs and the owner-signed manifest; the run id binds the owner's key.
- ``keys``       the run's DHT keys and ``RunKeys``, the rule every daemon's DHT node applies to them.
- ``publisher``  keeping this peer's entries in the DHT; a failed store raises the alarm.
- ``records``    signed peer records: what each peer publishes, the checks on reading one, a row.
- ``admission``  the run's admission policy (open, allowlist, join tokens).
- ``view``       the live peer table, rebuilt from verified, admitted records (bounded per read).
- ``tenure``     which peers may steer a choice: the tenured ones, so free new identities cannot.
- ``joining``    starting the DHT node; finding and verifying a manifest; the lonely-network line.
- ``addresses``  the host a peer announces (never 0.0.0.0, port 0, or loopback to a remote swarm)."""
