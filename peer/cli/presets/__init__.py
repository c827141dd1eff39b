"""Built-in run configs for ``gossamer swarm --preset NAME`` (package data: one TOML file per preset)."""
