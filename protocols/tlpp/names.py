"""The protocol's name and its role names (spelled here once; the plugin binds them to the roles)."""

PROTOCOL = "tlpp"

ORCHESTRATOR = "tlpp-orchestrator"  # the run owner's trainer: the layers above the cut, the optimizer, the batches
NODE = "node"  # a data owner: private samples and the layers below the cut
HELPER = "helper"  # secure mode's second, independent party (``gossamer helper``)
