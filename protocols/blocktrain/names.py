"""The protocol's name and its role names (spelled here once; the plugin binds them to the roles)."""

PROTOCOL = "blocktrain"

COORDINATOR = "block-coordinator"  # the run owner's: versioned block checkpoints, assignment, averaging
WORKER = "block-worker"  # trains the block the coordinator assigns
SERVER = "block-server"  # serves blocks over TCP (``gossamer serve``)
AR_STAGE = "ar-stage"  # serves stages of the matched autoregressive baseline (``gossamer serve --ar_stages``)
