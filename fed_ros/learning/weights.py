"""Policy <-> StateDict (ordered name -> float32 numpy array) and safetensors checkpoints.

The state dict is exactly ``model.state_dict()`` (parameters and persistent buffers, all
float) in module order, as float32 numpy arrays: the names are the core manifest names. No
pickle anywhere: checkpoints and byte blobs are safetensors.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from safetensors.numpy import load as st_load
from safetensors.numpy import load_file as st_load_file
from safetensors.numpy import save as st_save
from safetensors.numpy import save_file as st_save_file

from fed_ros.learning.configuration_policy import PolicyConfig

StateDict = dict[str, np.ndarray]
ModuleT = TypeVar("ModuleT", bound=torch.nn.Module)


def policy_to_state_dict(model: torch.nn.Module) -> StateDict:
    """Copy every float parameter/buffer into an ordered dict of float32 numpy arrays."""
    out: StateDict = OrderedDict()
    for name, tensor in model.state_dict().items():
        if not torch.is_floating_point(tensor):
            raise ValueError(f"tensor {name!r} has non-float dtype {tensor.dtype}")
        out[name] = tensor.detach().to("cpu", torch.float32).numpy().copy()
    return out


def check_state_dict(model: torch.nn.Module, sd: StateDict) -> None:
    """Raise ValueError naming the first missing/unexpected/misshapen/non-finite tensor."""
    own = model.state_dict()
    missing = [n for n in own if n not in sd]
    unexpected = [n for n in sd if n not in own]
    if missing:
        raise ValueError(f"state dict is missing tensor {missing[0]!r} ({len(missing)} missing)")
    if unexpected:
        raise ValueError(
            f"state dict has unexpected tensor {unexpected[0]!r} ({len(unexpected)} unexpected)"
        )
    for name, ref in own.items():
        arr = np.asarray(sd[name])
        if tuple(arr.shape) != tuple(ref.shape):
            raise ValueError(
                f"tensor {name!r} has shape {tuple(arr.shape)}, expected {tuple(ref.shape)}"
            )
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"tensor {name!r} contains NaN/Inf")


def load_state_dict_into(model: ModuleT, sd: StateDict) -> ModuleT:
    """Copy a StateDict into the model in place (exact names and shapes); returns the model."""
    check_state_dict(model, sd)
    own = model.state_dict()
    with torch.no_grad():
        for name, ref in own.items():
            ref.copy_(torch.from_numpy(np.ascontiguousarray(sd[name], dtype=np.float32)))
    return model


_ORDER_KEY = "fed_ros.tensor_order"


def _metadata(
    sd: StateDict, policy_cfg: PolicyConfig | None, extra: dict[str, str] | None
) -> dict[str, str]:
    meta = dict(extra or {})
    # safetensors lays tensors out by dtype/name; record the module order to restore it.
    meta[_ORDER_KEY] = json.dumps(list(sd))
    if policy_cfg is not None:
        meta["policy_config"] = json.dumps(policy_cfg.to_dict(), sort_keys=True)
    return meta


def save_checkpoint(
    path: str | Path,
    sd: StateDict,
    policy_cfg: PolicyConfig | None = None,
    metadata: dict[str, str] | None = None,
) -> Path:
    """Write a safetensors file atomically (temp + rename); the config goes in the metadata."""
    path = Path(path)
    arrays = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in sd.items()}
    tmp = path.with_name(path.name + ".tmp")
    st_save_file(arrays, str(tmp), metadata=_metadata(sd, policy_cfg, metadata))
    tmp.replace(path)
    return path


def load_checkpoint(path: str | Path) -> StateDict:
    """Read a checkpoint written by :func:`save_checkpoint` (tensor order preserved)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"checkpoint {str(path)!r} does not exist")
    try:
        arrays = st_load_file(str(path))
        with open(path, "rb") as f:
            head = f.read(8)
            head += f.read(int.from_bytes(head, "little"))
        return OrderedDict((k, arrays[k]) for k in _ordered_names(head, arrays))
    except Exception as exc:  # safetensors raises its own error type on corrupt input
        raise ValueError(
            f"checkpoint {str(path)!r} is not a valid safetensors file: {exc}"
        ) from exc


def read_checkpoint_config(path: str | Path) -> PolicyConfig | None:
    """The PolicyConfig stored in a checkpoint's metadata, if any."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        meta = f.metadata() or {}
    raw = meta.get("policy_config")
    return PolicyConfig.from_dict(json.loads(raw)) if raw else None


def state_dict_to_bytes(sd: StateDict, metadata: dict[str, str] | None = None) -> bytes:
    """Serialise a StateDict to safetensors bytes."""
    arrays = {k: np.ascontiguousarray(v) for k, v in sd.items()}
    return st_save(arrays, metadata=_metadata(sd, None, metadata))


def state_dict_from_bytes(blob: bytes) -> StateDict:
    """Inverse of :func:`state_dict_to_bytes` (tensor order preserved)."""
    if not isinstance(blob, (bytes, bytearray)) or len(blob) < 8:
        raise ValueError("blob is not a safetensors payload")
    try:
        arrays = st_load(bytes(blob))
        return OrderedDict((k, arrays[k]) for k in _ordered_names(bytes(blob), arrays))
    except Exception as exc:  # safetensors raises its own error type on corrupt input
        raise ValueError(f"blob is not a valid safetensors payload: {exc}") from exc


def _ordered_names(blob: bytes, arrays: dict[str, np.ndarray]) -> list[str]:
    """Tensor names in their saved (module) order, falling back to file order."""
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + n].decode())
    meta = header.pop("__metadata__", None) or {}
    order = json.loads(meta[_ORDER_KEY]) if _ORDER_KEY in meta else []
    if sorted(order) == sorted(arrays):
        return order
    return sorted(header, key=lambda k: header[k]["data_offsets"][0])
