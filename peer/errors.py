"""The peer layer's exception tree: the runtime's errors and those of the protocols' roles
(a protocol's core draws its own in ``protocols/core/errors.py``).

::

    PeerError
     ├── ConfigError        bad flags / TOML / run config; the message names the option
     │    └── DataSourceError   (tlpp.data) a node's --data that cannot be read or is not images
     ├── ManifestError      a run manifest that does not verify or does not match the run id
     ├── RecordRejected     a peer record that is unsigned, mis-signed, expired or not admitted
     ├── StartupError       the daemon could not start (port in use, DHT, bootstrap); actionable text
     ├── StateSyncError     (kit.statesync) a joiner could not get the run's state from any donor
     │    └── NoQuorum      (kit.state_join) no state has a majority of the tenured donors behind it
     ├── SecureLinkError    (kit.secure_link) an encrypted link failed; it is closed
     ├── RequestRefused     (kit.secure_link) the peer refused a request, with a code; the link stays
     ├── RouteFailed        (route.client) no live host is left for a unit of the route
     │    └── NoReachableHost   only private hosts (no relay reaches them) hold that unit
     ├── FrameRefused       (context.wire) a ring frame refused, with a code; the shard serves on
     ├── StepAborted        (context.attempt) a context-parallel step's attempt was abandoned
     ├── StateMismatch      (context.replica) a downloaded state does not fit the run's model
     └── TrainingStopped    (tlpp.steps) TL++ training cannot go on
          └── HelperFailed  the TL++ helper failed a request (secure mode stops with this)

Protocol modules are named from ``gossamer.protocols``. The CLI prints these as one-line
``error: ...`` messages (exit code 2), never as tracebacks.
"""

from __future__ import annotations


class PeerError(Exception):
    """Base of every error the peer layer raises on purpose."""


class ConfigError(PeerError):
    """A flag, TOML option or run config value is invalid; the message names it."""


class ManifestError(PeerError):
    """A manifest failed verification or does not belong to the run id it was fetched for."""


class RecordRejected(PeerError):
    """A peer record was refused. ``reason`` is a short category for counters: signature,
    identity, expired, future, malformed or policy; the message has the details."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class StartupError(PeerError):
    """The daemon could not start; the message says what to do about it."""
