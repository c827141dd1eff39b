"""The protocol's name and its role names (spelled here once; the plugin binds them to the roles)."""

PROTOCOL = "tlpp"

SERVER = "tlpp-server"  # the run owner's: the model above the cut, the optimizer, the virtual batches
NODE = "node"  # a data owner: private samples and the layers below the cut
HELPER = "helper"  # secure mode's second, independent server (``gossamer helper``)
