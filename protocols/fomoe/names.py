"""The protocol's name and its role names (spelled here once; the plugin binds them to the roles)."""

PROTOCOL = "fomoe"

EXPERT_HOST = "expert-host"  # the dense layers, the routers and a resident subset of the experts
