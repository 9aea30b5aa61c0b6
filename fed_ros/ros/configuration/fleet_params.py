"""The server's and robot node's parameters, each declared once
(fed_ros.ros.configuration.param_spec).

``ServerParams`` and ``RobotParams`` are what the nodes declare (with ParameterDescriptors),
what the fleet plan and the launch files fill in, and what a live ``ros2 param set`` is checked
against. config/server.yaml and robot.yaml are documented examples of them; a test keeps their
keys and defaults equal to these. The names every fleet node shares (algorithms, sim tasks,
policy kinds, ids, the episode cap) and the common value checks live here too; the nodes on the
arm side (adapter, sim bridge, expert driver, teleop) are
:mod:`fed_ros.ros.configuration.arm_params`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from fed_ros.core.encodings import MODEL_ENCODINGS, UPDATE_ENCODINGS
from fed_ros.core.encodings.topk import DEFAULT_FRACTION
from fed_ros.core.rounds.buffered import STALENESS_KINDS
from fed_ros.core.strategies.base import STRATEGIES
from fed_ros.core.tracking import TRACKING_KINDS
from fed_ros.ros.configuration.param_spec import NodeParams, param
from fed_ros.ros.wire.channels import CHANNELS

# The strategy registry's names: `STRATEGIES` maps each to its class's dotted path, so reading it
# imports no strategy module (no scipy; measured 0.03 s), and a new strategy is one line there.
ALGORITHMS = tuple(STRATEGIES)
# Mirrors fed_ros.sim.envs.TASKS, kept as literals so a launch file can validate a config without
# importing MuJoCo (test_fleet_plan checks they stay in sync).
SIM_TASKS = ("lift", "pick_place_can", "stack")
POLICY_KINDS = ("lowdim", "image")
# = fed_ros.learning.backbones.specs.VISION_BACKBONES (test_fleet_plan keeps them equal).
VISION_BACKBONES = ("scratch", "resnet18_imagenet", "dinov2_vits14", "fleet")
TRANSFER_CHANNELS = CHANNELS  # the channel registry is fed_ros.ros.wire.channels
CAMERA_TRANSPORTS = ("raw", "compressed")  # = fed_ros.ros.arm.topics.CAMERA_TRANSPORTS
SERVER_NAMESPACE = "/fleet"
# One episode cap for the robot node and the arm adapter (the plan gives the adapter the robot's).
MAX_EPISODE_STEPS = 400

ID_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


def _ids(values: Any) -> str | None:
    bad = [v for v in values if v and not ID_RE.match(v)]
    return f"has a bad id {bad[0]!r} (ids match {ID_RE.pattern})" if bad else None


def _device(value: str) -> str | None:
    ok = value in ("auto", "cpu", "cuda") or value.startswith("cuda:")
    return None if ok else "must be auto, cpu or cuda[:N]"


def _absolute_or_empty(value: str) -> str | None:
    return None if value == "" or value.startswith("/") else "must be empty or absolute"


def _absolute(value: str) -> str | None:
    return None if value.startswith("/") else "must be absolute"


def not_empty(value: str) -> str | None:
    """A string parameter that must be set (shared with the arm-side nodes' parameters)."""
    return None if value else "must not be empty"


def _tasks(values: Any) -> str | None:
    return None if len(values) >= 1 and all(values) else "must name at least one task"


def backbone_param() -> Any:
    """``vision_backbone``: the camera trunk; the server and every robot must name the same."""
    return param(
        "scratch",
        "camera trunk of the image policy: scratch (trained from random weights) or a "
        "pretrained backbone read from backbone_weights (docs/learning.md, 'Choosing a visual "
        "encoder'); server and robots must agree",
        choices=VISION_BACKBONES,
    )


def backbone_weights_param() -> Any:
    """``backbone_weights``: the pretrained backbone's weights file."""
    return param(
        "",
        "with a pretrained vision_backbone: its weights file (.pth / .safetensors), '' = the "
        "torch hub cache (fleet: the server's encoder stage, encoder_rounds); never downloaded, "
        "a missing file stops the node at start",
    )


def freeze_backbone_param() -> Any:
    """``freeze_backbone``: whether the pretrained backbone stays fixed."""
    return param(
        True,
        "with a pretrained vision_backbone: true = fixed, cached per frame, not federated; "
        "false = fine-tuned and federated with the policy",
    )


def check_backbone(node: str, policy: str, vision_backbone: str, backbone_weights: str) -> None:
    """A pretrained backbone needs the image policy; weights need a pretrained backbone."""
    if vision_backbone != "scratch" and policy != "image":
        raise ValueError(
            f"{node} parameter 'vision_backbone' is {vision_backbone!r} but 'policy' is "
            f"{policy!r}: a camera backbone needs policy image"
        )
    if vision_backbone == "scratch" and backbone_weights:
        raise ValueError(
            f"{node} parameter 'backbone_weights' is {backbone_weights!r} but "
            "'vision_backbone' is 'scratch' (name the pretrained backbone the file holds)"
        )


# PolicyConfig fields set by a node parameter of their own, never under architecture.*.
_OWN_PARAMETERS = {
    "kind": "policy",
    "vision_backbone": "vision_backbone",
    "backbone_weights": "backbone_weights",
    "freeze_backbone": "freeze_backbone",
    "use_object_state": "use_object_state",
}


def architecture_fields(node: str, extra: Mapping[str, Any]) -> dict[str, Any]:
    """The PolicyConfig fields under ``architecture.<field>`` (the policy's size: widths,
    window, layers, ...), which the server and every robot must set alike; ValueError names an
    unknown field or one that has a parameter of its own."""
    from dataclasses import fields

    from fed_ros.learning.configuration_policy import PolicyConfig

    known = {f.name for f in fields(PolicyConfig)} - set(_OWN_PARAMETERS)
    out = {}
    for name, value in extra.items():
        if not name.startswith("architecture."):
            continue
        key = name[len("architecture.") :]
        if key in _OWN_PARAMETERS:
            raise ValueError(
                f"{node} parameter {name!r}: set the parameter {_OWN_PARAMETERS[key]!r} instead"
            )
        if key not in known:
            raise ValueError(
                f"unknown {node} parameter {name!r} (known: "
                f"{', '.join('architecture.' + k for k in sorted(known))})"
            )
        # A ROS integer array may come as array.array: a list, as PolicyConfig and JSON take.
        out[key] = (
            value
            if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__")
            else list(value)
        )
    return out


def check_architecture(params: Any) -> None:
    """The node's PolicyConfig, built once at parameter time, so that a bad
    ``architecture.*`` value stops the node at start naming the parameter."""
    from fed_ros.learning.configuration_policy import PolicyConfig

    try:
        PolicyConfig(**policy_architecture(params))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{params.NODE} parameters architecture.*: {exc}") from None


def policy_architecture(params: Any, backbone_weights: str | None = None) -> dict[str, Any]:
    """PolicyConfig keyword arguments the server and robot nodes take from their parameters
    (``backbone_weights``: the fleet encoder's file, where the node keeps it)."""
    out: dict[str, Any] = {"kind": params.policy, **architecture_fields(params.NODE, params.extra)}
    if params.vision_backbone != "scratch":
        out.update(
            vision_backbone=params.vision_backbone,
            backbone_weights=backbone_weights or params.backbone_weights or None,
            freeze_backbone=params.freeze_backbone,
        )
    return out


@dataclass(frozen=True)
class ServerParams(NodeParams):
    """Parameters of the fleet server node (fed_ros/ros/nodes/server/server_node.py)."""

    NODE: ClassVar[str] = "server"
    # strategy.* -> make_strategy(**settings); encoder.* -> FleetEncoderConfig fields.
    # architecture.* -> PolicyConfig fields (the same on every robot).
    OPEN_PREFIXES: ClassVar[tuple[str, ...]] = ("strategy", "encoder", "architecture")
    # One name per idea: the step limit is the round's local_steps and the robot's
    # train_max_steps; this one only bounds what a heartbeat may claim (issue 38).
    RENAMED: ClassVar[Mapping[str, str]] = {"max_train_steps": "heartbeat_step_budget"}

    algorithm: str = param("feddrman", "strategy name", choices=ALGORITHMS)
    rounds: int = param(3, "rounds to complete, then STAGE_DONE", ge=1)
    num_clusters: int = param(2, "C for FedDRMan / IFCA (ignored by the others)", ge=1)
    expected_robots: tuple[str, ...] = param(
        ("",), "robot ids that must register before round 0 ([''] = none)", check=_ids
    )
    min_robots: int = param(1, "start round 0 once this many robots registered", ge=1)
    registration_timeout_s: float = param(
        120.0, "after this, start with >= min_robots registered", unit="s", gt=0.0, live=True
    )
    quorum_fraction: float = param(
        0.75, "fraction of participants whose update completes a round", gt=0.0, le=1.0
    )
    min_quorum: int = param(1, "lower bound on the quorum", unit="updates", ge=1)
    round_timeout_s: float = param(
        600.0,
        "deadline = announcement time + this (from the next announcement)",
        unit="s",
        gt=0.0,
        live=True,
    )
    max_attempts: int = param(3, "announcements of one round before the server gives up", ge=1)
    buffer_size: int = param(
        0,
        "asynchronous buffered rounds (FedBuff): aggregate a cluster as soon as this many of its "
        "robots' updates are in, taking stale ones down-weighted (0 = synchronous rounds)",
        unit="updates",
        ge=0,
    )
    max_staleness: int = param(
        4,
        "with buffer_size: updates trained from a cluster model this many versions old or less "
        "are used",
        unit="versions",
        ge=0,
    )
    staleness: str = param(
        "polynomial",
        "with buffer_size: a stale update's weight, polynomial (1 + tau) ** -staleness_exponent "
        "or constant (no down-weighting, the ablation)",
        choices=STALENESS_KINDS,
    )
    staleness_exponent: float = param(
        0.5, "with buffer_size: the polynomial weight's exponent (FedBuff: 0.5)", ge=0.0
    )
    buffer_sync_rounds: int = param(
        1,
        "with buffer_size: the first rounds stay synchronous (clustering sees every robot once "
        "before any model moves)",
        unit="rounds",
        ge=0,
    )
    heartbeat_timeout_s: float = param(
        20.0,
        "a training robot's deadline extension runs out this long after its last heartbeat",
        unit="s",
        gt=0.0,
        live=True,
    )
    max_deadline_extension_s: float = param(
        600.0,
        "cap on heartbeat extensions: no deadline moves past the announced one + this "
        "(0 = heartbeats extend nothing)",
        unit="s",
        ge=0.0,
        live=True,
    )
    heartbeat_step_budget: int = param(
        1_000_000, "step budget a heartbeat may claim when the round sets no local_steps", ge=1
    )
    state_dir: str = param(
        "runs/server", "ModelStore directory (committed rounds)", check=not_empty
    )
    spill_release_s: float = param(
        1.0,
        "seconds between unmapping the spilled updates' pages from the server's RSS (their data "
        "stays in the page cache; 0 = never: written and read rows stay resident)",
        unit="s",
        ge=0.0,
    )
    policy: str = param(
        "lowdim", "initial policy kind when no model is committed yet", choices=POLICY_KINDS
    )
    vision_backbone: str = backbone_param()
    backbone_weights: str = backbone_weights_param()
    freeze_backbone: bool = freeze_backbone_param()
    encoder_rounds: int = param(
        0,
        "fleet encoder: FedAvg rounds of every robot's shared camera encoder before policy "
        "round 0 (and each refresh), settings under encoder.* (FleetEncoderConfig); needs "
        "vision_backbone fleet with backbone_weights '' (0 = off)",
        unit="rounds",
        ge=0,
    )
    encoder_refresh_every: int = param(
        0,
        "with encoder_rounds: policy rounds between encoder stages (0 = only before round 0)",
        unit="rounds",
        ge=0,
    )
    encoder_timeout_s: float = param(
        600.0,
        "with encoder_rounds: an encoder round closes with the updates in by this long after "
        "its announcement (all robots answered: at once)",
        unit="s",
        gt=0.0,
    )
    seed: int = param(0, "seed of the initial policy weights")
    evaluate_every: int = param(
        0, "rounds between closed-loop evaluations (0 = never)", unit="rounds", ge=0, live=True
    )
    eval_episodes: int = param(
        2, "episodes per task per robot evaluation", unit="episodes", ge=1, live=True
    )
    eval_timeout_s: float = param(
        600.0, "time to wait for robots' evaluation results", unit="s", gt=0.0, live=True
    )
    max_update_bytes: int = param(
        256 << 20, "larger updates are rejected before assembly", unit="bytes", ge=1024
    )
    max_samples: int = param(1_000_000, "cap on self-reported sample counts", ge=1)
    transfer_channel: str = param(
        "auto", "model bytes over ROS messages or the zmq bulk channel", choices=TRANSFER_CHANNELS
    )
    bulk_threshold_bytes: int = param(
        1 << 20, "with transfer_channel auto, payloads this large go over zmq", unit="bytes", ge=0
    )
    model_encoding: str = param(
        "float32",
        "how cluster models travel: float32 (exact), float16, int8 (a scale per tensor), "
        "int8_block (a scale per 128 values), int4_block (4 bits, a scale per 64); the server "
        "keeps float32",
        live=True,
        choices=MODEL_ENCODINGS,
    )
    tracking: str = param(
        "auto",
        "each round's outcome to TensorBoard (auto: when installed; tensorboard, mlflow, none)",
        choices=TRACKING_KINDS,
    )
    tracking_dir: str = param(
        "", "where the tracking files go (empty: <state_dir>/../tb/server, the run's tb tree)"
    )
    exit_when_done: bool = param(
        False, "exit 0 after the last round instead of staying up", live=True
    )
    rounds_enabled: bool = param(
        True,
        "gate: false = the round in progress finishes, no new round is announced "
        "(also ~/set_rounds; ~/end_fleet ends the fleet, docs/fleet.md)",
        live=True,
    )
    require_signatures: bool = param(False, "reject unsigned updates (Ed25519, fed-ros keys)")
    allowed_keys_file: str = param("", "allow-list of robot public keys (YAML), '' = any")
    private_key_file: str = param("", "server Ed25519 key: signs cluster models, '' = unsigned")

    @property
    def robots_expected(self) -> list[str]:
        """expected_robots without the empty placeholder ROS needs for an empty string array."""
        return [r for r in self.expected_robots if r]

    def _check(self) -> None:
        if self.require_signatures and not self.allowed_keys_file:
            raise ValueError(
                "server parameter 'require_signatures' is true but 'allowed_keys_file' is empty"
            )
        check_backbone(self.NODE, self.policy, self.vision_backbone, self.backbone_weights)
        check_architecture(self)
        self._check_encoder()

    def _check_encoder(self) -> None:
        if self.encoder_refresh_every and not self.encoder_rounds:
            raise ValueError(
                f"server parameter 'encoder_refresh_every' is {self.encoder_refresh_every} but "
                "'encoder_rounds' is 0 (the fleet encoder is off)"
            )
        if not self.encoder_rounds:
            return
        if self.vision_backbone != "fleet" or self.backbone_weights:
            raise ValueError(
                f"server parameter 'encoder_rounds' is {self.encoder_rounds} but the policy "
                f"reads vision_backbone {self.vision_backbone!r} from "
                f"{self.backbone_weights or 'the hub cache'!r}: the fleet encoder needs "
                "vision_backbone 'fleet' and backbone_weights '' (the server's encoder)"
            )
        if self.require_signatures:
            # EncoderUpdate carries no signature yet: a signed fleet would take unsigned encoders.
            raise ValueError(
                "server parameter 'encoder_rounds' is set but 'require_signatures' is true: "
                "encoder updates are not signed yet (docs/fleet.md)"
            )


@dataclass(frozen=True)
class RobotParams(NodeParams):
    """Parameters of the onboard robot node (fed_ros/ros/nodes/robot/robot_node.py)."""

    NODE: ClassVar[str] = "robot"
    # trainer.* -> TrainerConfig fields; architecture.* -> PolicyConfig fields (the server's).
    OPEN_PREFIXES: ClassVar[tuple[str, ...]] = ("trainer", "architecture")

    robot_id: str = param(
        "",
        "'' = the node namespace without the leading '/'",
        check=lambda v: None if ID_RE.match(v) or v == "" else f"must match {ID_RE.pattern}",
    )
    tasks: tuple[str, ...] = param(
        ("lift",), "tasks this robot records and is evaluated on", check=_tasks
    )
    variation: str = param("default", "environment variation preset (sim) / site tag (real)")
    fleet_namespace: str = param(
        SERVER_NAMESPACE, "where the server's topics and services live", check=_absolute
    )
    arm_namespace: str = param(
        "", "'' = <robot ns>/arm/...; '/P' = /P/arm/... (a real driver)", check=_absolute_or_empty
    )
    data_dir: str = param(
        "",
        "demonstrations (demos/: recordings, *.npz episodes), models ('' = runs/robots/<robot_id>)",
    )
    collect_demos_on_start: int = param(
        0, "episodes to record with the scripted expert over ROS", unit="episodes", ge=0
    )
    min_demos: int = param(
        1,
        "successful demonstrations needed before the robot trains; with fewer it "
        "answers TRAIN with 'waiting for demonstrations (have k of N)'",
        unit="episodes",
        ge=1,
        live=True,
    )
    demo_seed: int = param(0, "seed of the first bootstrap episode")
    demo_noise_std: float = param(
        0.0, "expert action noise for demonstration diversity", ge=0.0, live=True
    )
    max_episode_steps: int = param(
        MAX_EPISODE_STEPS, "safety cap for expert / policy episodes", unit="steps", ge=1, live=True
    )
    policy: str = param(
        "lowdim", "policy kind (must match the server's model)", choices=POLICY_KINDS
    )
    vision_backbone: str = backbone_param()
    backbone_weights: str = backbone_weights_param()
    freeze_backbone: bool = freeze_backbone_param()
    use_object_state: bool = param(
        True,
        "false: the policy takes no object_state (a real arm without "
        "perception; needs policy image, docs/arms.md)",
    )
    camera_transport: str = param(
        "raw",
        "cameras as sensor_msgs/Image on <camera>/image_raw (raw) or "
        "CompressedImage JPEG/PNG on .../image_raw/compressed",
        choices=CAMERA_TRANSPORTS,
    )
    device: str = param("auto", "torch device for training: auto | cpu | cuda[:N]", check=_device)
    torch_threads: int = param(0, "CPU threads for torch (0 = torch's default: all cores)", ge=0)
    seed: int = param(0, "training seed (offset by round)")
    train_batch_size: int = param(
        32, "frames per batch (next round)", unit="frames", ge=1, live=True
    )
    train_lr: float = param(
        1e-4, "AdamW learning rate (next round; a round config's lr wins)", gt=0.0, live=True
    )
    train_max_steps: int = param(
        0,
        "cap on optimiser steps per round (0 = full epochs; next round)",
        unit="steps",
        ge=0,
        live=True,
    )
    eval_episodes: int = param(
        2, "default episodes per task for EvaluatePolicy", unit="episodes", ge=1, live=True
    )
    register_timeout_s: float = param(
        60.0, "time to keep retrying registration before giving up", unit="s", gt=0.0, live=True
    )
    learning_enabled: bool = param(
        True,
        "gate: false = no training, demo collection or evaluation; round "
        "announcements are skipped (also ~/set_learning, docs/arms.md)",
        live=True,
    )
    transfer_channel: str = param(
        "auto", "model bytes over ROS messages or the zmq bulk channel", choices=TRANSFER_CHANNELS
    )
    bulk_threshold_bytes: int = param(
        1 << 20, "with transfer_channel auto, payloads this large go over zmq", unit="bytes", ge=0
    )
    update_encoding: str = param(
        "float32",
        "how updates travel: float32 (exact), float16, int8 (a scale per tensor), int8_block "
        "(a scale per 128 values), int4_block (4 bits, a scale per 64), topk (the "
        "update_topk_fraction largest changes per tensor, the rest kept on the robot for the next "
        "round), int8_delta / int4_delta (the change since the start model, quantized and "
        "deflated, its rounding error kept on the robot)",
        live=True,
        choices=UPDATE_ENCODINGS,
    )
    tracking: str = param(
        "auto",
        "training losses per step and evaluations to TensorBoard (auto: when installed; "
        "tensorboard, mlflow, none)",
        choices=TRACKING_KINDS,
    )
    tracking_dir: str = param(
        "", "where the tracking files go (empty: <data_dir>/../tb/<robot_id>, the run's tb tree)"
    )
    update_topk_fraction: float = param(
        DEFAULT_FRACTION,
        "with update_encoding topk: fraction of each tensor's entries sent (8 bytes each)",
        live=True,
        gt=0.0,
        le=1.0,
    )
    update_retry_s: float = param(
        2.0,
        "time before an unacknowledged update is re-sent (doubling, max 10 s; each wait spread "
        "+-50 % so robots dropped together do not come back together)",
        unit="s",
        gt=0.0,
    )
    heartbeat_period_s: float = param(
        5.0,
        "while training, tell the server how far it has got this often: it extends the "
        "robot's deadline while steps advance (0 = off)",
        unit="s",
        ge=0.0,
        live=True,
    )
    train_step_delay_s: float = param(
        0.0,
        "extra seconds after every optimiser step: emulates a slower onboard computer (SIL "
        "tests, capacity planning); 0 on a real robot",
        unit="s",
        ge=0.0,
        live=True,
    )
    private_key_file: str = param("", "Ed25519 key (fed-ros keys) to sign updates, '' = unsigned")
    allowed_keys_file: str = param("", "allow-list YAML whose `server:` key signs cluster models")

    @classmethod
    def _resolve(cls, fields: dict[str, Any], namespace: str = "", **_: Any) -> dict[str, Any]:
        """An empty robot_id comes from the namespace, an empty data_dir from the robot id."""
        if not fields.get("robot_id"):
            fields["robot_id"] = namespace.strip("/").replace("/", "_")
        if not fields.get("data_dir"):
            fields["data_dir"] = f"runs/robots/{fields['robot_id']}"
        return fields

    def _check(self) -> None:
        if not ID_RE.match(self.robot_id):
            raise ValueError(
                f"robot parameter 'robot_id' must match {ID_RE.pattern}, got {self.robot_id!r}"
            )
        if self.policy == "lowdim" and not self.use_object_state:
            raise ValueError(
                "robot parameter 'use_object_state' is false but 'policy' is lowdim: the low-dim "
                "policy sees the scene only through object_state (use policy image)"
            )
        check_backbone(self.NODE, self.policy, self.vision_backbone, self.backbone_weights)
        check_architecture(self)

    def local_training(self) -> dict[str, Any]:
        """The robot's own training settings (a round config overrides what it decides)."""
        local: dict[str, Any] = {
            "lr": self.train_lr,
            "batch_size": self.train_batch_size,
            "max_steps": self.train_max_steps or None,
        }
        local.update({k[len("trainer.") :]: v for k, v in self.extra.items()})
        return local
