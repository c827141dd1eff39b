"""Device selection: ``auto`` means CUDA when present, else CPU; a named device is checked."""

from __future__ import annotations

import torch

from gossamer.peer.errors import ConfigError


def resolve_device(name: str) -> torch.device:
    """Turn a ``--device`` value into a torch.device, refusing devices this host does not have."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: CUDA is not available on this host (use --device auto or cpu)")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(f"--device {name}: this host has {torch.cuda.device_count()} CUDA device(s)")
    return device


def describe_device(device: torch.device) -> dict[str, object]:
    """Capacity facts for the peer record: device kind and memory."""
    info: dict[str, object] = {"device": str(device)}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(device_name=props.name, memory_bytes=int(props.total_memory))
    return info
