"""Pure conversions between numpy / state dicts and fed_ros messages.

Nothing here starts a node: the functions take and return plain values and generated
message objects, so they are unit-tested without ROS processes (nav2_simple_commander
style) and the nodes stay thin.

Performance rule (issue 2): a message is never filled through the generated public
array setter with an ndarray, which iterates element by element (about 1.6 s for
21.5 MB). Payload bytes are packed once into one contiguous uint8 buffer (one pass over
the tensors), chunk messages hold zero-copy memoryviews of that buffer in their private
``_data`` field (rclpy's C conversion accepts any buffer-protocol object there and does
the one unavoidable memcpy into the DDS sample), and received bytes are read with
``np.frombuffer`` over the message's ``array.array`` (zero copy).
"""
from __future__ import annotations

import array
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from fed_ros.core.params import Manifest, TensorSpec, manifest_of
from fed_ros.core.round_config import RoundConfig
from fed_ros.msg import (
    ClientDescriptor as ClientDescriptorMsg,
    ClusterMembership,
    ClusterModel,
    ModelUpdate,
    RoundAnnouncement,
    RoundConfig as RoundConfigMsg,
    TensorPayload,
    TensorSpec as TensorSpecMsg,
)

if TYPE_CHECKING:
    from fed_ros.core.strategy import ClientDescriptor as CoreDescriptor

StateDict = dict[str, np.ndarray]

# Encoding names <-> TensorPayload.ENCODING_* constants.
ENCODINGS: dict[str, int] = {
    "float32": TensorPayload.ENCODING_FLOAT32,
    "float16": TensorPayload.ENCODING_FLOAT16,
    "int8": TensorPayload.ENCODING_INT8,
}
ENCODING_NAMES: dict[int, str] = {v: k for k, v in ENCODINGS.items()}
# Bytes per element on the wire, per encoding (little-endian, no padding).
_WIRE_DTYPE: dict[int, np.dtype] = {
    TensorPayload.ENCODING_FLOAT32: np.dtype("<f4"),
    TensorPayload.ENCODING_FLOAT16: np.dtype("<f2"),
    TensorPayload.ENCODING_INT8: np.dtype("i1"),
}
_FLOAT16_MAX = float(np.finfo(np.float16).max)
# Model dtypes a manifest may name (core state dicts are float32; see core/params.py).
MODEL_DTYPES = frozenset({"float32"})
DESCRIPTOR_KINDS: dict[str, int] = {
    "gaussian": ClientDescriptorMsg.KIND_GAUSSIAN,
    "rnd": ClientDescriptorMsg.KIND_RND,
    "update": ClientDescriptorMsg.KIND_UPDATE,
    "embedding": ClientDescriptorMsg.KIND_EMBEDDING,
}
DESCRIPTOR_KIND_NAMES: dict[int, str] = {v: k for k, v in DESCRIPTOR_KINDS.items()}
STAGES: dict[str, int] = {
    "train": RoundAnnouncement.STAGE_TRAIN,
    "describe": RoundAnnouncement.STAGE_DESCRIBE,
    "score": RoundAnnouncement.STAGE_SCORE,
    "evaluate": RoundAnnouncement.STAGE_EVALUATE,
    "done": RoundAnnouncement.STAGE_DONE,
}
STAGE_NAMES: dict[int, str] = {v: k for k, v in STAGES.items()}


# --------------------------------------------------------------------------- bytes

def set_bytes_field(msg: Any, name: str, data: Any) -> None:
    """Assign bytes-like ``data`` to a uint8[] field without the element-wise setter.

    ``data`` may be bytes, bytearray, memoryview, array.array('B') or a C-contiguous
    ndarray; it is stored as a flat uint8 memoryview (zero copy). rclpy's generated C
    conversion reads it through the buffer protocol (one memcpy at publish time).
    """
    private = "_" + name
    if private not in getattr(type(msg), "__slots__", ()):
        raise ValueError(f"message {type(msg).__name__} has no field {name!r}")
    view = memoryview(data)
    if not view.c_contiguous:
        raise ValueError(f"field {name!r}: data must be C-contiguous")
    setattr(msg, private, view.cast("B") if view.format != "B" or view.ndim != 1 else view)


def set_float32_field(msg: Any, name: str, values: Any) -> None:
    """Assign a float32 array to a float32[] field in one copy (no element-wise setter)."""
    private = "_" + name
    if private not in getattr(type(msg), "__slots__", ()):
        raise ValueError(f"message {type(msg).__name__} has no field {name!r}")
    arr = np.ascontiguousarray(values, dtype=np.float32).ravel()
    out = array.array("f")
    out.frombytes(memoryview(arr).cast("B"))
    setattr(msg, private, out)


def bytes_view(data: Any) -> np.ndarray:
    """Zero-copy uint8 view of a received uint8[] field (array.array, bytes, memoryview)."""
    if len(data) == 0:
        return np.zeros(0, dtype=np.uint8)
    return np.frombuffer(data, dtype=np.uint8)


def sha256_hex(data: Any) -> str:
    """Lower-case hex SHA-256 of a bytes-like object (no copy)."""
    return hashlib.sha256(memoryview(data)).hexdigest()


# ----------------------------------------------------------------------- manifests

def manifest_to_msgs(manifest: Sequence[TensorSpec]) -> list[TensorSpecMsg]:
    """Core manifest -> list of fed_ros/TensorSpec messages."""
    return [TensorSpecMsg(name=s.name, shape=[int(d) for d in s.shape], dtype=s.dtype)
            for s in manifest]


def manifest_from_msgs(specs: Sequence[TensorSpecMsg]) -> Manifest:
    """fed_ros/TensorSpec messages -> core manifest (validated: names unique, float dtypes)."""
    out: list[TensorSpec] = []
    seen: set[str] = set()
    for spec in specs:
        name = str(spec.name)
        if not name:
            raise ValueError("manifest: empty tensor name")
        if name in seen:
            raise ValueError(f"manifest: duplicate tensor name {name!r}")
        if spec.dtype not in MODEL_DTYPES:
            raise ValueError(f"manifest: tensor {name!r} has unsupported dtype {spec.dtype!r}")
        seen.add(name)
        # TensorSpec validates the rest (shape) and raises ValueError naming the tensor.
        out.append(TensorSpec(name=name, shape=tuple(int(d) for d in spec.shape), dtype=str(spec.dtype)))
    return tuple(out)


def _numel(shape: Sequence[int]) -> int:
    # Python ints: an adversarial shape cannot overflow into a small allocation.
    return math.prod(int(d) for d in shape)


def encoded_size(manifest: Sequence[TensorSpec], encoding: int) -> int:
    """Number of payload bytes the manifest implies under ``encoding``."""
    if encoding not in _WIRE_DTYPE:
        raise ValueError(f"unknown payload encoding {encoding!r}")
    return sum(_numel(s.shape) for s in manifest) * _WIRE_DTYPE[encoding].itemsize


def _encoding_id(encoding: int | str) -> int:
    if isinstance(encoding, str):
        if encoding not in ENCODINGS:
            raise ValueError(f"unknown encoding {encoding!r}; expected one of {sorted(ENCODINGS)}")
        return ENCODINGS[encoding]
    if encoding not in _WIRE_DTYPE:
        raise ValueError(f"unknown payload encoding {encoding!r}")
    return int(encoding)


# ------------------------------------------------------------------ encode / decode

@dataclass(frozen=True)
class EncodedPayload:
    """A state dict packed into one contiguous uint8 buffer (payload order = manifest order)."""

    manifest: Manifest
    encoding: int
    scales: np.ndarray  # float32 (len(manifest),) for int8, empty otherwise
    data: np.ndarray  # uint8 (total_bytes,), C-contiguous
    sha256: str = field(default="")

    @property
    def total_bytes(self) -> int:
        """Size of the encoded payload in bytes."""
        return int(self.data.nbytes)


def encode_state_dict(sd: Mapping[str, np.ndarray], encoding: int | str = "float32") -> EncodedPayload:
    """Pack a state dict into one buffer (one pass over the tensors) and hash it."""
    enc = _encoding_id(encoding)
    wire = _WIRE_DTYPE[enc]
    specs = manifest_of(sd)  # validates: ndarray, float32, non-empty unique names
    total = encoded_size(specs, enc)
    data = np.empty(total, dtype=np.uint8)
    scales = np.zeros(len(specs) if enc == TensorPayload.ENCODING_INT8 else 0, dtype=np.float32)
    offset = 0
    for i, (name, value) in enumerate(sd.items()):
        arr = np.asarray(value)
        n = arr.size
        dest = data[offset: offset + n * wire.itemsize].view(wire)
        if enc == TensorPayload.ENCODING_INT8:
            peak = float(np.max(np.abs(arr))) if n else 0.0
            if not math.isfinite(peak):
                raise ValueError(f"tensor {name!r} is not finite; int8 encoding needs finite values")
            scale = peak / 127.0 if peak > 0 else 1.0
            scales[i] = scale
            np.clip(np.rint(arr.reshape(-1) / scale), -127, 127, out=dest, casting="unsafe")
        else:
            if enc == TensorPayload.ENCODING_FLOAT16 and n and float(np.max(np.abs(arr))) > _FLOAT16_MAX:
                # float16 would turn these into inf silently; the server rejects non-finite updates.
                raise ValueError(f"tensor {name!r} exceeds the float16 range (|x| > {_FLOAT16_MAX})")
            # Writes straight into the payload buffer: the only copy of the tensor bytes.
            np.copyto(dest, arr.reshape(-1), casting="same_kind")
        offset += n * wire.itemsize
    return EncodedPayload(manifest=tuple(specs), encoding=enc, scales=scales, data=data, sha256=sha256_hex(data))


def decode_state_dict(manifest: Sequence[TensorSpec], encoding: int | str, data: Any,
                      scales: Sequence[float] | np.ndarray = (), copy: bool = False) -> StateDict:
    """Unpack payload bytes into a state dict; float32 tensors are zero-copy views unless ``copy``."""
    enc = _encoding_id(encoding)
    wire = _WIRE_DTYPE[enc]
    buf = bytes_view(data) if not isinstance(data, np.ndarray) else data.reshape(-1).view(np.uint8)
    expected = encoded_size(manifest, enc)
    if buf.nbytes != expected:
        raise ValueError(f"payload has {buf.nbytes} bytes; manifest and encoding "
                         f"{ENCODING_NAMES[enc]} imply {expected}")
    scale_arr = np.asarray(scales, dtype=np.float32).reshape(-1)
    if enc == TensorPayload.ENCODING_INT8:
        if scale_arr.size != len(manifest):
            raise ValueError(f"int8 payload needs {len(manifest)} scales, got {scale_arr.size}")
        if not np.all(np.isfinite(scale_arr)):
            raise ValueError("int8 payload has non-finite scales")
    out: StateDict = {}
    offset = 0
    for i, spec in enumerate(manifest):
        n = _numel(spec.shape)
        raw = buf[offset: offset + n * wire.itemsize].view(wire)
        offset += n * wire.itemsize
        if enc == TensorPayload.ENCODING_INT8:
            value = raw.astype(spec.dtype) * np.asarray(scale_arr[i], dtype=spec.dtype)
        elif raw.dtype == np.dtype(spec.dtype) and not copy:
            value = raw  # zero copy over the received buffer
        else:
            value = raw.astype(spec.dtype)
        out[spec.name] = value.reshape(spec.shape)
    return out


# --------------------------------------------------------------------------- chunks

def chunk_ranges(total_bytes: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """(offset, length) of each chunk; an empty payload is one empty chunk."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be > 0, got {chunk_bytes}")
    if total_bytes < 0:
        raise ValueError(f"total_bytes must be >= 0, got {total_bytes}")
    if total_bytes == 0:
        return [(0, 0)]
    return [(off, min(chunk_bytes, total_bytes - off)) for off in range(0, total_bytes, chunk_bytes)]


def payload_chunk(encoded: EncodedPayload, payload_id: str, index: int, chunk_bytes: int,
                  bulk_uri: str = "", manifest_msgs: list[TensorSpecMsg] | None = None) -> TensorPayload:
    """Build chunk ``index`` of ``encoded`` as a TensorPayload (data is a zero-copy view).

    With ``bulk_uri`` the message is the control-plane record only (no data, one chunk).
    """
    if not payload_id:
        raise ValueError("payload_id must not be empty")
    ranges = [(0, encoded.total_bytes)] if bulk_uri else chunk_ranges(encoded.total_bytes, chunk_bytes)
    if not 0 <= index < len(ranges):
        raise ValueError(f"chunk index {index} out of range [0, {len(ranges)})")
    offset, length = ranges[index]
    msg = TensorPayload(
        payload_id=payload_id,
        manifest=manifest_msgs if manifest_msgs is not None else manifest_to_msgs(encoded.manifest),
        encoding=encoded.encoding,
        total_bytes=encoded.total_bytes,
        chunk_index=index,
        chunk_count=len(ranges),
        chunk_offset=offset,
        bulk_uri=bulk_uri,
        sha256=encoded.sha256,
    )
    if encoded.scales.size:
        set_float32_field(msg, "scales", encoded.scales)
    if not bulk_uri:
        set_bytes_field(msg, "data", encoded.data[offset: offset + length])
    return msg


def payload_header(msg: TensorPayload) -> dict[str, Any]:
    """The fields every chunk of one payload must agree on (for mixing checks)."""
    return {
        "payload_id": msg.payload_id,
        "encoding": int(msg.encoding),
        "total_bytes": int(msg.total_bytes),
        "chunk_count": int(msg.chunk_count),
        "sha256": msg.sha256,
        "bulk_uri": msg.bulk_uri,
    }


# ------------------------------------------------------------- model messages

def model_update_msg(chunk: TensorPayload, *, robot_id: str, round_idx: int, base_round: int,
                     cluster_id: int = -1, num_samples: int = 0, train_loss: float = float("nan"),
                     val_loss: float = float("nan"), nonce: bytes = b"", signature: bytes = b"",
                     stamp: Any = None) -> ModelUpdate:
    """Wrap one payload chunk in a ModelUpdate (robot -> server)."""
    if not robot_id:
        raise ValueError("robot_id must not be empty")
    if round_idx < 0 or base_round < 0:
        raise ValueError(f"rounds must be >= 0, got round={round_idx} base_round={base_round}")
    if num_samples < 0:
        raise ValueError(f"num_samples must be >= 0, got {num_samples}")
    msg = ModelUpdate(robot_id=robot_id, round=int(round_idx), base_round=int(base_round),
                      cluster_id=int(cluster_id), num_samples=int(num_samples),
                      train_loss=float(train_loss), val_loss=float(val_loss), payload=chunk)
    if stamp is not None:
        msg.header.stamp = stamp
    set_bytes_field(msg, "nonce", nonce)
    set_bytes_field(msg, "signature", signature)
    return msg


def cluster_model_msg(chunk: TensorPayload, *, cluster_id: int, round_idx: int,
                      member_robot_ids: Sequence[str] = (), signature: bytes = b"",
                      stamp: Any = None) -> ClusterModel:
    """Wrap one payload chunk in a ClusterModel (server -> robots)."""
    if round_idx < 0:
        raise ValueError(f"round must be >= 0, got {round_idx}")
    msg = ClusterModel(cluster_id=int(cluster_id), round=int(round_idx),
                       member_robot_ids=[str(r) for r in member_robot_ids], payload=chunk)
    if stamp is not None:
        msg.header.stamp = stamp
    set_bytes_field(msg, "signature", signature)
    return msg


# ---------------------------------------------------------------- descriptors

def descriptor_to_msg(desc: "CoreDescriptor", round_idx: int, nonce: bytes = b"",
                      signature: bytes = b"", stamp: Any = None) -> ClientDescriptorMsg:
    """Core ClientDescriptor -> fed_ros/ClientDescriptor message."""
    if desc.kind not in DESCRIPTOR_KINDS:
        raise ValueError(f"unknown descriptor kind {desc.kind!r}; expected one of {sorted(DESCRIPTOR_KINDS)}")
    mean = np.zeros(0, np.float32) if desc.mean is None else np.asarray(desc.mean, np.float32).reshape(-1)
    var = np.zeros(0, np.float32) if desc.variance is None else np.asarray(desc.variance, np.float32).reshape(-1)
    if var.size and var.size != mean.size:
        raise ValueError(f"descriptor of {desc.robot_id!r}: mean has {mean.size} dims, variance {var.size}")
    names = sorted(desc.scores)
    msg = ClientDescriptorMsg(robot_id=desc.robot_id, round=int(round_idx), kind=DESCRIPTOR_KINDS[desc.kind],
                              dims=int(mean.size), score_robot_ids=names,
                              residual_std=float(desc.residual_std), num_samples=int(desc.num_samples))
    if stamp is not None:
        msg.header.stamp = stamp
    set_float32_field(msg, "mean", mean)
    set_float32_field(msg, "variance", var)
    set_float32_field(msg, "scores", np.asarray([desc.scores[n] for n in names], np.float32))
    set_bytes_field(msg, "payload", bytes(desc.payload))
    set_bytes_field(msg, "nonce", nonce)
    set_bytes_field(msg, "signature", signature)
    return msg


def descriptor_from_msg(msg: ClientDescriptorMsg, max_dims: int = 1 << 16,
                        max_payload_bytes: int = 16 << 20) -> "CoreDescriptor":
    """fed_ros/ClientDescriptor -> core ClientDescriptor, validated (V5: finite, var > 0, dims)."""
    from fed_ros.core.strategy import ClientDescriptor as CoreDescriptor
    kind = DESCRIPTOR_KIND_NAMES.get(int(msg.kind))
    if kind is None:
        raise ValueError(f"descriptor from {msg.robot_id!r}: unknown kind {msg.kind}")
    if not msg.robot_id:
        raise ValueError("descriptor: empty robot_id")
    dims = int(msg.dims)
    if dims > max_dims:
        raise ValueError(f"descriptor from {msg.robot_id!r}: dims {dims} > cap {max_dims}")
    mean = np.frombuffer(msg.mean, dtype=np.float32).copy() if len(msg.mean) else np.zeros(0, np.float32)
    var = np.frombuffer(msg.variance, dtype=np.float32).copy() if len(msg.variance) else np.zeros(0, np.float32)
    if mean.size != dims or (var.size and var.size != dims):
        raise ValueError(f"descriptor from {msg.robot_id!r}: dims={dims} but mean has {mean.size}, "
                         f"variance {var.size} values")
    if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(var))):
        raise ValueError(f"descriptor from {msg.robot_id!r}: non-finite mean or variance")
    if var.size and not np.all(var > 0):
        raise ValueError(f"descriptor from {msg.robot_id!r}: variances must be > 0")
    if len(msg.score_robot_ids) != len(msg.scores):
        raise ValueError(f"descriptor from {msg.robot_id!r}: {len(msg.score_robot_ids)} score ids "
                         f"but {len(msg.scores)} scores")
    scores = {str(n): float(s) for n, s in zip(msg.score_robot_ids, msg.scores)}
    if not all(math.isfinite(s) for s in scores.values()):
        raise ValueError(f"descriptor from {msg.robot_id!r}: non-finite score")
    if len(msg.payload) > max_payload_bytes:
        raise ValueError(f"descriptor from {msg.robot_id!r}: payload {len(msg.payload)} B > cap {max_payload_bytes}")
    return CoreDescriptor(robot_id=str(msg.robot_id), kind=kind,
                          mean=mean if dims else None, variance=var if var.size else None,
                          num_samples=int(msg.num_samples), scores=scores,
                          residual_std=float(msg.residual_std), payload=bytes(msg.payload))


# -------------------------------------------------------------- announcements

@dataclass(frozen=True)
class Announcement:
    """A RoundAnnouncement as plain values."""

    round_idx: int
    stage: str
    deadline_s: float  # ROS time in seconds
    algorithm: str
    participants: tuple[str, ...]
    memberships: dict[str, list[tuple[int, float]]]
    quorum: int
    configs: dict[str, RoundConfig] = field(default_factory=dict)  # per robot; absent = defaults


def _check_membership(robot_id: str, membership: Sequence[tuple[int, float]]) -> None:
    if not membership:
        raise ValueError(f"membership of {robot_id!r} is empty")
    weights = [float(w) for _, w in membership]
    if not all(math.isfinite(w) and w >= 0 for w in weights):
        raise ValueError(f"membership of {robot_id!r} has invalid weights {weights}")
    if abs(sum(weights) - 1.0) > 1e-3:
        raise ValueError(f"membership weights of {robot_id!r} sum to {sum(weights)}, expected 1")


def round_config_to_msg(cfg: RoundConfig) -> RoundConfigMsg:
    """RoundConfig -> message (unset optional fields travel as 0)."""
    return RoundConfigMsg(version=cfg.version, prox_mu=cfg.prox_mu, use_sub=cfg.use_sub, use_act=cfg.use_act,
                          lambda_sub=cfg.lambda_sub, lambda_act=cfg.lambda_act, local_epochs=cfg.local_epochs,
                          local_steps=cfg.local_steps or 0, lr=cfg.lr or 0.0, descriptor_kind=cfg.descriptor_kind,
                          pick_cluster=cfg.pick_cluster, eval_episodes=cfg.eval_episodes or 0)


def round_config_from_msg(msg: RoundConfigMsg) -> RoundConfig:
    """Message -> RoundConfig; a bad value or unknown version raises ValueError naming it."""
    return RoundConfig(version=int(msg.version), prox_mu=float(msg.prox_mu), use_sub=bool(msg.use_sub),
                       use_act=bool(msg.use_act), lambda_sub=float(msg.lambda_sub), lambda_act=float(msg.lambda_act),
                       local_epochs=int(msg.local_epochs), local_steps=int(msg.local_steps) or None,
                       lr=float(msg.lr) or None, descriptor_kind=str(msg.descriptor_kind),
                       pick_cluster=bool(msg.pick_cluster), eval_episodes=int(msg.eval_episodes) or None)


def announcement_to_msg(ann: Announcement) -> RoundAnnouncement:
    """Announcement -> RoundAnnouncement message (validated)."""
    if ann.stage not in STAGES:
        raise ValueError(f"unknown stage {ann.stage!r}; expected one of {sorted(STAGES)}")
    if ann.round_idx < 0 or ann.quorum < 0:
        raise ValueError(f"round and quorum must be >= 0: {ann}")
    if ann.quorum > len(ann.participants):
        raise ValueError(f"quorum {ann.quorum} > {len(ann.participants)} participants")
    if not math.isfinite(ann.deadline_s) or ann.deadline_s < 0:
        raise ValueError(f"deadline must be a finite time >= 0, got {ann.deadline_s}")
    msg = RoundAnnouncement(round=int(ann.round_idx), stage=STAGES[ann.stage], algorithm=ann.algorithm,
                            participants=list(ann.participants), quorum=int(ann.quorum))
    sec = int(math.floor(ann.deadline_s))
    msg.deadline.sec = sec
    msg.deadline.nanosec = min(int(round((ann.deadline_s - sec) * 1e9)), 999_999_999)
    members = []
    for robot_id, membership in ann.memberships.items():
        _check_membership(robot_id, membership)
        members.append(ClusterMembership(robot_id=robot_id, cluster_ids=[int(c) for c, _ in membership],
                                         weights=[float(w) for _, w in membership],
                                         config=round_config_to_msg(ann.configs.get(robot_id, RoundConfig()))))
    msg.memberships = members
    return msg


def announcement_from_msg(msg: RoundAnnouncement) -> Announcement:
    """RoundAnnouncement message -> Announcement (validated)."""
    stage = STAGE_NAMES.get(int(msg.stage))
    if stage is None:
        raise ValueError(f"round announcement: unknown stage {msg.stage}")
    memberships: dict[str, list[tuple[int, float]]] = {}
    configs: dict[str, RoundConfig] = {}
    for m in msg.memberships:
        if len(m.cluster_ids) != len(m.weights):
            raise ValueError(f"membership of {m.robot_id!r}: {len(m.cluster_ids)} clusters, {len(m.weights)} weights")
        membership = [(int(c), float(w)) for c, w in zip(m.cluster_ids, m.weights)]
        _check_membership(m.robot_id, membership)
        memberships[str(m.robot_id)] = membership
        try:
            configs[str(m.robot_id)] = round_config_from_msg(m.config)
        except ValueError as exc:
            raise ValueError(f"round config of {m.robot_id!r}: {exc}") from None
    return Announcement(round_idx=int(msg.round), stage=stage,
                        deadline_s=msg.deadline.sec + msg.deadline.nanosec * 1e-9,
                        algorithm=str(msg.algorithm), participants=tuple(msg.participants),
                        memberships=memberships, quorum=int(msg.quorum), configs=configs)
