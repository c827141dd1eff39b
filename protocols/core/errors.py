"""The protocols package's exception tree.

::

    ProtocolError
     ├── InvalidSetting     a configuration that cannot work (e.g. 2f >= n for an aggregator,
     │                      an unknown topology); the message names the setting
     ├── NotEnoughUpdates   too few usable contributions arrived for a round or an aggregator
     ├── PacingError        (pacing) a measured duration, a deadline ceiling or a SlowPeers bound
     │                      that makes no sense (Pacing's own fields: InvalidSetting)
     ├── ExpertMessageRefused  (fomoe.core.errors) a FoMoE message that does not fit the run's
     │                      model or placement (a commit, an update, an expert's state)
     ├── BlockTrainError    (blocktrain) a bad BlockTrain setting, tensor or state
     ├── TraversalError     (tlpp) a TL++ model, cut or batch that cannot work
     └── ContextError       (context) compressed context parallelism:
          ├── InvalidRing       a ring, chunking or subspace setting that cannot work
          └── MessageRefused    a coefficient message refused (``.code`` says why)
               └── BasisMismatch    its basis hash is not this member's: never a silent corruption
"""

from __future__ import annotations


class ProtocolError(Exception):
    """Base of every error ``protocols`` raises on purpose."""


class InvalidSetting(ProtocolError, ValueError):
    """A setting that cannot work; the message names it."""


class NotEnoughUpdates(ProtocolError):
    """Too few usable contributions arrived (after rejecting bad ones)."""
