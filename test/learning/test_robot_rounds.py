"""RobotRounds over explicit collaborators (fakes here, no rclpy node): TRAIN goes through the
client's `choose_start` and `fit`, SCORE through `stage_descriptor` with the peers' predictors,
a declined stage publishes once the topic is matched; and it reads no private attribute."""

from __future__ import annotations

import ast
import threading
import types
from pathlib import Path

import numpy as np
import pytest

from fed_ros.core.rounds.config import RoundConfig
from fed_ros.core.rounds.collect import DESCRIBE, SCORE, TRAIN
from fed_ros.learning.client import RobotClient
from fed_ros.learning.configuration_policy import PolicyConfig
from fed_ros.learning.dataset import synthetic_episodes
from fed_ros.learning.trainer import LocalResult, initial_state_dict
from fed_ros.msg import ClientDescriptor as DescriptorMsg
from fed_ros.ros.nodes.robot import rounds as robot_rounds
from fed_ros.ros.nodes.robot.rounds import RobotRounds, RoundsCollaborators
from fed_ros.ros.wire.round_msgs import Announcement

CFG = PolicyConfig(
    kind="lowdim",
    embed_dim=32,
    window=2,
    transformer_layers=1,
    transformer_heads=2,
    transformer_ff=64,
    dropout=0.0,
    text_dim=64,
    num_modes=5,
)
ROBOT = "robot_0"


class Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, text: str, **_kw) -> None:
        self.lines.append(text)

    warning = warn = info


class Publisher:
    def __init__(self) -> None:
        self.sent: list = []

    def publish(self, msg) -> None:
        self.sent.append(msg)


class Client(RobotClient):
    """The real client, with `fit` and the IFCA pick replaced by recorders (no training)."""

    def __init__(self, pick: int = 0) -> None:
        super().__init__(ROBOT, CFG, device="cpu")
        self.picked_from: list[int] = []
        self.fitted: list = []
        self.pick = pick

    def pick_cluster(self, candidate_models, episodes):
        self.picked_from = sorted(candidate_models)
        return self.pick

    def fit(self, start_model, config, episodes, round_idx, on_step=None, on_start=None):
        self.fitted.append((start_model, config, round_idx))
        on_start(1)
        on_step(1, {"bc": 0.5})
        return LocalResult(
            params=start_model, num_samples=7, metrics={"steps": 1.0, "loss_bc": 0.5}
        )


class Models:
    """ModelCache stand-in: cluster c's model is theta^0 with every tensor + c."""

    def __init__(self) -> None:
        self.theta0 = initial_state_dict(CFG, seed=0)
        self.asked: list = []

    def for_round(self, round_idx, membership):
        self.asked.append((round_idx, list(membership)))
        total = sum(w for _, w in membership if w > 0)
        return {
            k: sum(np.float32(w / total) * (v + np.float32(c)) for c, w in membership if w > 0)
            for k, v in self.theta0.items()
        }


class Uplink:
    def __init__(self) -> None:
        self.offers: list = []

    def cached(self, round_idx):
        return None

    def offer(self, payload, ann, fields, grace_s=0.0):
        self.offers.append((payload, ann.round_idx, fields))
        return types.SimpleNamespace(encoded=payload)


def _rounds(tmp_path: Path, client: Client, waiting: str = "", peers: dict | None = None):
    demos = types.SimpleNamespace(
        status=lambda: waiting, episodes=lambda: synthetic_episodes(2, 10)
    )
    log, descriptors, metrics, waited = Log(), Publisher(), Publisher(), []
    rounds = RobotRounds(
        RoundsCollaborators(
            client=client,
            models=Models(),
            uplink=Uplink(),
            demos=demos,
            arm=None,
            arm_lock=threading.Lock(),
            params=lambda: types.SimpleNamespace(
                eval_episodes=1,
                seed=0,
                update_encoding="float32",
                heartbeat_period_s=5.0,
                train_step_delay_s=0.0,
                tracking="tensorboard",
                tracking_dir=str(tmp_path / "tb"),
            ),
            log=log,
            stop=threading.Event(),
            latest=lambda: None,
            signer=None,
            model_dir=tmp_path,
            log_transfer=lambda **entry: None,
            descriptor_pub=descriptors,
            metrics_pub=metrics,
            wait_matched=lambda pub, what: waited.append(what),
        )
    )
    rounds.peer_predictors.update(peers or {})
    return rounds, log, descriptors, metrics, waited


def _announcement(
    stage: str, membership, config: RoundConfig, participants=(ROBOT,)
) -> Announcement:
    return Announcement(
        round_idx=3,
        stage=stage,
        deadline_s=0.0,
        algorithm="x",
        participants=tuple(participants),
        memberships={ROBOT: membership},
        quorum=1,
        configs={ROBOT: config},
    )


def test_train_starts_from_the_weighted_membership_model_and_reports_its_heaviest_cluster(tmp_path):
    client = Client()
    rounds, log, *_ = _rounds(tmp_path, client)
    rounds.run_stage(_announcement(TRAIN, [(0, 0.25), (1, 0.75)], RoundConfig(local_steps=1)))
    assert rounds.models.asked == [(3, [(0, 0.25), (1, 0.75)])] and client.picked_from == []
    start, config, round_idx = client.fitted[0]
    for key, value in rounds.models.theta0.items():
        np.testing.assert_allclose(start[key], value + 0.75, rtol=1e-6, atol=1e-6)
    assert (config.local_steps, round_idx) == (1, 3)
    ((_, offered_round, fields),) = rounds.uplink.offers
    assert offered_round == 3 and fields["cluster_id"] == 1 and fields["num_samples"] == 7
    assert rounds.last_train[0] == 1 and (tmp_path / "local_round_0003.safetensors").is_file()
    assert any("trained 1 steps" in line for line in log.lines)
    # Its loss at each optimiser step went to TensorBoard, read back as TensorBoard reads it.
    from support.tb_events import read_scalars

    assert read_scalars(tmp_path / "tb")["train/bc"] == [(1, 0.5)]


def test_train_with_pick_cluster_waits_for_every_listed_model_and_trains_the_chosen_one(tmp_path):
    client = Client(pick=2)
    rounds, *_ = _rounds(tmp_path, client)
    rounds.run_stage(
        _announcement(TRAIN, [(0, 1.0), (1, 0.0), (2, 0.0)], RoundConfig(pick_cluster=True))
    )
    assert rounds.models.asked == [(3, [(0, 1.0)]), (3, [(1, 1.0)]), (3, [(2, 1.0)])]
    assert client.picked_from == [0, 1, 2] and rounds.uplink.offers[0][2]["cluster_id"] == 2


def test_train_without_membership_fails_and_sends_nothing(tmp_path):
    rounds, *_ = _rounds(tmp_path, Client())
    with pytest.raises(ValueError, match="no cluster with weight > 0"):
        rounds.run_stage(_announcement(TRAIN, [], RoundConfig()))
    assert rounds.uplink.offers == [] and rounds.models.asked == []


def test_a_robot_waiting_for_demonstrations_declines_once_the_topic_is_matched(tmp_path):
    rounds, _, descriptors, metrics, waited = _rounds(
        tmp_path, Client(), waiting="waiting for demonstrations"
    )
    rounds.run_stage(_announcement(DESCRIBE, [(0, 1.0)], RoundConfig()))
    assert waited == ["the fleet's robot_metrics topic"] and descriptors.sent == []
    ((msg,),) = [metrics.sent]
    assert (
        not msg.accepted
        and msg.reason == "waiting for demonstrations"
        and list(msg.cluster_ids) == [0]
    )


def test_describe_then_score_publish_the_stage_descriptors_with_the_peers_predictors(tmp_path):
    client = Client()
    rounds, log, descriptors, _, waited = _rounds(tmp_path, client)
    rounds.run_stage(_announcement(DESCRIBE, [(0, 1.0)], RoundConfig(descriptor_kind="rnd")))
    assert int(descriptors.sent[0].kind) == DescriptorMsg.KIND_RND and waited == [
        "the fleet's descriptors topic"
    ]
    peer = RobotClient("robot_1", CFG, robot_seed=1, device="cpu")
    predictor = peer.describe("rnd", synthetic_episodes(2, 10, seed=1)).payload
    rounds.peer_predictors[(3, "robot_1")] = predictor
    rounds.run_stage(
        _announcement(
            SCORE, [(0, 1.0)], RoundConfig(descriptor_kind="rnd"), participants=(ROBOT, "robot_1")
        )
    )
    scored = descriptors.sent[1]
    assert sorted(scored.score_robot_ids) == ["robot_0", "robot_1"]
    assert log.lines[-1] == "round 3: sent rnd descriptor"


def test_robot_rounds_reads_no_private_attribute_of_another_object():
    tree = ast.parse(Path(robot_rounds.__file__).read_text())
    private = [
        f"line {n.lineno}: {ast.unparse(n)}"
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute)
        and n.attr.startswith("_")
        and not n.attr.startswith("__")
        and not (isinstance(n.value, ast.Name) and n.value.id == "self")
    ]
    assert not private, private
