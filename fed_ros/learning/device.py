"""Device selection and seeding: CUDA (with AMP) when present, CPU otherwise, one code path."""

from __future__ import annotations

import contextlib
import random

import numpy as np
import torch


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """ "auto" -> cuda if available else cpu; explicit names are validated."""
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu" or device.startswith("cuda"):
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but CUDA is not available")
        return torch.device(device)
    raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:i]', got {device!r}")


def autocast(device: torch.device, enabled: bool = True) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA (no grad scaler needed), a no-op on CPU."""
    if enabled and device.type == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def seed_everything(seed: int) -> None:
    """Seed Python, numpy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated memory: CUDA allocator peak, or the process max RSS on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
