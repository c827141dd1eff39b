"""Who is in the run.

- ``manifest``   run configs and the owner-signed manifest; the run id binds the owner's key.
- ``keys``       the run's DHT keys (the manifest, the peer records) and ``RunKeys``, the rule
                 every daemon's DHT node applies to them (which keys exist, who writes the
                 manifest, how long an entry lives).
- ``publisher``  keeping this peer's entries in the DHT; a failed store raises the alarm.
- ``records``    signed peer records: what each peer publishes, and the checks on reading one.
- ``admission``  the run's admission policy (open, allowlist, join tokens).
- ``view``       the live peer table, rebuilt from verified, admitted records (a bounded number
                 verified per read; each peer's tenure as seen here).
- ``tenure``     which peers may steer a choice: the tenured ones (seen live long enough, or
                 vouched for by the run owner), so free new identities cannot.
- ``joining``    starting the DHT node with actionable errors; finding and verifying a manifest;
                 the line for a network nobody else joins (two DHTs that never meet).
- ``addresses``  address hygiene: the host a peer announces (never 0.0.0.0, port 0, or loopback
                 to a remote swarm) and the DHT / data-plane disagreement line.
"""
