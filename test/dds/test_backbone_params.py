"""The camera backbone as node parameters (issue 37): ``vision_backbone``, ``backbone_weights``,
``freeze_backbone`` on the server and the robot node, carried by the fleet file and the plan.

Unit tests check the values and the plan; the ROS tests start the real nodes: a one-robot
fleet trains a round on a pretrained backbone read from a small checkpoint the test writes
(the fleet's own encoder trunk, saved as its stage saves it), and a robot whose weights file
is missing stops at start with the backbones' error naming the path.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import wait_until
from fed_ros.ros.fleet.fleet_file import fleet_config_from_dict
from fed_ros.ros.configuration.fleet_params import VISION_BACKBONES, RobotParams, ServerParams
from fed_ros.ros.fleet.plan import plan_fleet
from support.fleets import fleet_document

ROBOT = "robot_0"


def _fleet(tmp_path, **keys) -> dict:
    robots = [{"id": ROBOT, "task": "lift", "sim": False}]
    return fleet_document(
        **{
            "name": "backbones",
            "policy": "image",
            "run_dir": str(tmp_path),
            "robots": robots,
            **keys,
        }
    )


def _fleet_weights(tmp_path) -> str:
    """A small ``fleet`` backbone file (an untrained fleet encoder's trunk)."""
    from fed_ros.learning.configuration_fleet_encoder import FleetEncoderConfig
    from fed_ros.learning.fleet_encoder import initial_encoder_state, save_backbone

    path = tmp_path / "weights" / "fleet_encoder.safetensors"
    return str(save_backbone(initial_encoder_state(FleetEncoderConfig()), path))


def test_node_backbone_names_match_the_policy_configuration():
    from fed_ros.learning.backbones.specs import VISION_BACKBONES as LEARNING_BACKBONES

    assert VISION_BACKBONES == LEARNING_BACKBONES


def test_fleet_file_gives_server_and_robots_the_same_backbone(tmp_path):
    config = fleet_config_from_dict(
        _fleet(
            tmp_path,
            vision_backbone="resnet18_imagenet",
            backbone_weights="/w/resnet18-f37072fd.pth",
            freeze_backbone=False,
        )
    )
    want = {
        "vision_backbone": "resnet18_imagenet",
        "backbone_weights": "/w/resnet18-f37072fd.pth",
        "freeze_backbone": False,
    }
    nodes = {n.executable: n.parameters for n in plan_fleet(config)}
    for executable in ("server_node", "robot_node"):
        assert {k: nodes[executable][k] for k in want} == want, executable


def test_fleet_file_architecture_gives_server_and_robots_one_policy(tmp_path):
    from fed_ros.learning.configuration_policy import PolicyConfig
    from fed_ros.ros.configuration.fleet_params import policy_architecture

    arch = {"conv_channels": [64, 128, 256, 512], "embed_dim": 128, "window": 3}
    config = fleet_config_from_dict(_fleet(tmp_path, architecture=arch))
    nodes = {n.executable: n for n in plan_fleet(config)}
    server = ServerParams.from_mapping(nodes["server_node"].parameters)
    robot = RobotParams.from_mapping(nodes["robot_node"].parameters, namespace="/robot_0")
    cfgs = [PolicyConfig(**policy_architecture(p)) for p in (server, robot)]
    assert cfgs[0] == cfgs[1]
    assert (cfgs[0].conv_channels, cfgs[0].embed_dim, cfgs[0].window) == (
        (64, 128, 256, 512),
        128,
        3,
    )


@pytest.mark.parametrize(
    "arch, message",
    [
        ({"kind": "lowdim"}, "server parameter 'architecture.kind': set the parameter 'policy'"),
        ({"vision_backbone": "fleet"}, "set the parameter 'vision_backbone' instead"),
        ({"widths": [8]}, "unknown server parameter 'architecture.widths' (known: "),
        ({"embed_dim": -4}, "server parameters architecture.*: embed_dim must be"),
    ],
)
def test_a_bad_architecture_is_refused_naming_it(tmp_path, arch, message):
    with pytest.raises(ValueError) as err:
        fleet_config_from_dict(_fleet(tmp_path, architecture=arch))
    assert message in str(err.value)


def test_architecture_must_be_a_mapping(tmp_path):
    with pytest.raises(ValueError, match="'architecture' must be a mapping, got \\[64\\]"):
        fleet_config_from_dict(_fleet(tmp_path, architecture=[64]))


def test_default_fleet_plan_carries_no_backbone_parameters(tmp_path):
    nodes = plan_fleet(fleet_config_from_dict(_fleet(tmp_path)))
    assert not any("vision_backbone" in n.parameters for n in nodes)


@pytest.mark.parametrize(
    "keys, message",
    [
        (
            dict(vision_backbone="resnet50"),
            "server parameter 'vision_backbone' must be one of "
            "('scratch', 'resnet18_imagenet', 'dinov2_vits14', 'fleet'), got 'resnet50'",
        ),
        (
            dict(vision_backbone="fleet", policy="lowdim"),
            "server parameter 'vision_backbone' is 'fleet' but 'policy' is 'lowdim'",
        ),
        (
            dict(backbone_weights="/w/resnet18.pth"),
            "server parameter 'backbone_weights' is '/w/resnet18.pth' but 'vision_backbone' is "
            "'scratch'",
        ),
        (dict(freeze_backbone="yes"), "'freeze_backbone' must be true or false, got 'yes'"),
        (dict(vision_backbone=18), "'vision_backbone' must be a string, got 18"),
    ],
    ids=["unknown", "lowdim", "weights-without-backbone", "freeze-not-bool", "not-a-string"],
)
def test_fleet_file_refuses_a_bad_backbone_naming_the_value(tmp_path, keys, message):
    with pytest.raises(ValueError) as err:
        fleet_config_from_dict(_fleet(tmp_path, **keys))
    assert message in str(err.value)


def test_robot_parameters_refuse_a_backbone_on_the_lowdim_policy():
    with pytest.raises(ValueError, match="robot parameter 'vision_backbone' is 'dinov2_vits14'"):
        RobotParams.from_mapping({"robot_id": ROBOT, "vision_backbone": "dinov2_vits14"})


def test_server_parameters_take_a_pretrained_backbone():
    p = ServerParams.from_mapping(
        {"policy": "image", "vision_backbone": "fleet", "backbone_weights": "/w/fleet.safetensors"}
    )
    assert (p.vision_backbone, p.backbone_weights, p.freeze_backbone) == (
        "fleet",
        "/w/fleet.safetensors",
        True,
    )


@pytest.mark.ros
@pytest.mark.timeout(300)
def test_a_fleet_trains_a_round_on_a_pretrained_backbone_file(tmp_path, ros_env, processes):
    from fed_ros.core.rounds.store import ModelStore
    from fed_ros.learning.configuration_policy import PolicyConfig
    from fed_ros.learning.dataset import synthetic_episodes
    from fed_ros.learning.trainer import initial_state_dict
    from fed_ros.ros.fleet.launcher import build_commands, fleet_env

    policy_kw = dict(
        kind="image", vision_backbone="fleet", backbone_weights=_fleet_weights(tmp_path)
    )
    config = fleet_config_from_dict(
        _fleet(
            tmp_path,
            vision_backbone="fleet",
            backbone_weights=policy_kw["backbone_weights"],
            strategy={"local_steps": 3, "lr": 1e-3},
            server={"round_timeout_s": 240.0, "exit_when_done": True},
            robot_defaults={
                "torch_threads": 1,
                "device": "cpu",
                "trainer.val_fraction": 0.0,
                "trainer.batch_size": 4,
            },
        )
    )
    demos = tmp_path / ROBOT / "demos"  # demonstrations on disk: training needs no arm
    demos.mkdir(parents=True)
    for j, episode in enumerate(synthetic_episodes(2, length=12, kind="image", seed=0)):
        episode.save(demos / f"synthetic_{j}.npz")
    commands = [
        c
        for c in build_commands(plan_fleet(config), tmp_path)
        if c.spec.executable in ("server_node", "robot_node")
    ]
    procs = {
        c.spec.executable: processes.start(c.argv, fleet_env(base=ros_env), log_path=c.log_path)
        for c in commands
    }
    logs = {c.spec.executable: c.log_path for c in commands}
    server = procs["server_node"]
    wait_until(
        lambda: server.poll() is not None,
        240,
        "the round on the pretrained backbone to commit",
        diagnostics=lambda: "\n".join(p.read_text()[-2000:] for p in logs.values()),
    )
    log = logs["server_node"].read_text()
    assert server.returncode == 0, log[-3000:]
    assert "round 0: completed (1/1 updates" in log, log[-3000:]
    committed = ModelStore(tmp_path / "server").load_latest()
    keys = set(next(iter(committed.cluster_models.values())))
    # The server built the robot's architecture: the frozen trunk read from the file is left
    # out of the federated model, its trainable adapters are in it.
    assert keys == set(initial_state_dict(PolicyConfig(**policy_kw))), sorted(keys)[:20]
    assert "agentview_encoder.adapter.weight" in keys
    assert not any("backbone" in k for k in keys)


@pytest.mark.ros
@pytest.mark.parametrize("module", ["robot.robot_node", "server.server_node"])
def test_a_missing_weights_file_stops_the_node_at_start_naming_it(tmp_path, ros_env, module):
    missing = tmp_path / "nowhere" / "resnet18-f37072fd.pth"
    args = [sys.executable, "-m", f"fed_ros.ros.nodes.{module}", "--ros-args"]
    args += ["-r", f"__ns:=/{ROBOT}"] if module == "robot.robot_node" else []
    for p in (
        "policy:=image",
        "vision_backbone:=resnet18_imagenet",
        f"backbone_weights:={missing}",
    ):
        args += ["-p", p]
    args += ["-p", f"state_dir:={tmp_path / 'server'}"] if module == "server.server_node" else []
    args += ["-p", f"data_dir:={tmp_path / ROBOT}"] if module == "robot.robot_node" else []
    done = subprocess.run(args, env=ros_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert str(missing) in done.stderr and "download.pytorch.org" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "keys, server, message",
    [
        (
            {},
            {"encoder_rounds": 1},
            "'encoder_rounds' is 1 but the policy reads vision_backbone 'scratch'",
        ),
        (
            dict(vision_backbone="fleet", backbone_weights="/w/fleet.safetensors"),
            {"encoder_rounds": 1},
            "the fleet encoder needs vision_backbone 'fleet' and backbone_weights ''",
        ),
        (
            dict(vision_backbone="fleet"),
            {"encoder_refresh_every": 2},
            "'encoder_refresh_every' is 2 but 'encoder_rounds' is 0",
        ),
        (
            dict(vision_backbone="fleet"),
            {"encoder_rounds": 1, "require_signatures": True, "allowed_keys_file": "/k.yaml"},
            "encoder updates are not signed yet",
        ),
    ],
    ids=["scratch", "own-file", "refresh-without-rounds", "signed-fleet"],
)
def test_the_encoder_stage_needs_the_servers_fleet_backbone(tmp_path, keys, server, message):
    with pytest.raises(ValueError) as err:
        fleet_config_from_dict(_fleet(tmp_path, server=server, **keys))
    assert message in str(err.value)


def test_encoder_settings_reach_the_fleet_encoder_config():
    from fed_ros.ros.nodes.server.encoder import fleet_encoder_config

    params = ServerParams.from_mapping(
        {
            "policy": "image",
            "vision_backbone": "fleet",
            "encoder_rounds": 2,
            "encoder_refresh_every": 4,
            "encoder.objective": "temporal",
            "encoder.local_steps": 7,
        }
    )
    cfg = fleet_encoder_config(params)
    assert (cfg.objective, cfg.local_steps, cfg.rounds, cfg.refresh_every) == ("temporal", 7, 2, 4)


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"encoder.rounds": 3}, "unknown server parameter 'encoder.rounds'"),
        ({"encoder.local_steps": 0}, "encoder.*: local_steps must be an int >= 1, got 0"),
        (
            {"encoder.objective": "contrastive"},
            "objective must be one of ('proprio', 'temporal', 'masked'), got 'contrastive'",
        ),
    ],
)
def test_a_bad_encoder_setting_is_named(setting, message):
    from fed_ros.ros.nodes.server.encoder import fleet_encoder_config

    params = ServerParams.from_mapping(
        {"policy": "image", "vision_backbone": "fleet", "encoder_rounds": 1, **setting}
    )
    with pytest.raises(ValueError) as err:
        fleet_encoder_config(params)
    assert message in str(err.value)
