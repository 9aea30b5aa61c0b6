"""A fleet whose bytes are compressed (issue 26, item 1): robots send int8_block updates and the
server float16 cluster models, or both int4_block, over real DDS with real robot nodes training;
and robots that send deltas against their start model: topk sparse, or int4_delta (quantized
and deflated).

Checked: every round completes with both updates accepted; each update is the size its
encoding implies for the policy's manifest (int8_block 3.9x, int4_block 7.1x fewer bytes than
float32); the robots received their cluster models at the model encoding's size; the server
stored float32 models, equal to the mean of the decoded updates the strategy saw (FedAvg); the
server's rounds and the robots' losses are in the run's TensorBoard tree.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from conftest import wait_until

rclpy = pytest.importorskip("rclpy")

ROBOTS = ("robot_0", "robot_1")


def _federate(tmp_path, ros_env, processes, name: str, model_encoding: str, robot: dict) -> str:
    """Run a two-robot FedAvg fleet (2 rounds, synthetic demos on disk, no arms) to its end with
    the robots' ``robot`` settings; the server's log."""
    from fed_ros.learning.dataset import synthetic_episodes
    from fed_ros.ros.fleet.fleet_file import fleet_config_from_dict
    from fed_ros.ros.fleet.launcher import build_commands, fleet_env
    from fed_ros.ros.fleet.plan import plan_fleet

    config = fleet_config_from_dict(
        {
            "fleet": {
                "name": name,
                "algorithm": "fedavg",
                "rounds": 2,
                "run_dir": str(tmp_path),
                "server": {
                    "round_timeout_s": 120.0,
                    "exit_when_done": True,
                    "model_encoding": model_encoding,
                },
                "robot_defaults": {
                    "train_max_steps": 2,
                    "torch_threads": 1,
                    "trainer.val_fraction": 0.0,
                    **robot,
                },
                "robots": [{"id": r, "task": "lift", "sim": False} for r in ROBOTS],
            }
        }
    )
    for k, rid in enumerate(ROBOTS):  # demonstrations on disk: training needs no arm
        (tmp_path / rid / "demos").mkdir(parents=True)
        for j, episode in enumerate(synthetic_episodes(2, length=20, seed=k)):
            episode.save(tmp_path / rid / "demos" / f"synthetic_{j}.npz")
    env = fleet_env(base=ros_env)
    commands = [
        c
        for c in build_commands(plan_fleet(config, include_server=True), tmp_path)
        if c.spec.executable != "arm_adapter_node"
    ]
    procs = {c.spec.executable: processes.start(c.argv, env, log_path=c.log_path) for c in commands}
    server = procs["server_node"]
    server_log = next(c.log_path for c in commands if c.spec.executable == "server_node")
    wait_until(
        lambda: server.poll() is not None,
        240,
        f"the {name} federation to finish",
        diagnostics=lambda: server_log.read_text()[-3000:],
    )
    log = server_log.read_text()
    assert server.returncode == 0, log[-3000:]
    return log


def _accepted_sizes(log: str) -> list[int]:
    return [
        int(b) for b in re.findall(r"update from robot_\d for round \d accepted \((\d+) B", log)
    ]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "update_encoding,model_encoding", [("int8_block", "float16"), ("int4_block", "int4_block")]
)
def test_blockwise_updates_and_compressed_models_federate(
    tmp_path, ros_env, processes, update_encoding, model_encoding
):
    from fed_ros.core.encodings import encoded_nbytes
    from fed_ros.core.rounds.store import ModelStore
    from fed_ros.learning.configuration_policy import PolicyConfig
    from fed_ros.learning.trainer import initial_state_dict

    robots = ROBOTS
    log = _federate(
        tmp_path,
        ros_env,
        processes,
        "compressed",
        model_encoding,
        {"update_encoding": update_encoding},
    )
    initial = initial_state_dict(PolicyConfig(kind="lowdim"), seed=0)
    fp32 = encoded_nbytes(initial, "float32")
    block, f16 = encoded_nbytes(initial, update_encoding), encoded_nbytes(initial, model_encoding)
    sizes = _accepted_sizes(log)
    assert sorted(sizes) == [block] * 4, (sizes, block)
    assert fp32 / block > {"int8_block": 3.8, "int4_block": 7.0}[update_encoding], (fp32, block)
    # The robots logged the cluster models they received: float16 bytes.
    for rid in robots:
        transfers = (tmp_path / rid / "transfers.jsonl").read_text()
        received = [
            int(b)
            for b in re.findall(r'"kind": "cluster_model_received"[^\n]*"bytes": (\d+)', transfers)
        ]
        assert received and set(received) == {f16}, transfers[-2000:]
    # The server keeps float32 models (decoded updates averaged).
    snap = ModelStore(tmp_path / "server").load_latest()
    assert snap is not None and snap.round_idx == 1
    for model in snap.cluster_models.values():
        assert all(v.dtype == np.float32 and np.all(np.isfinite(v)) for v in model.values())
    # Tracking (auto: TensorBoard, installed here) in the run's tb tree: the server's rounds
    # with the bytes it accepted, each robot's training loss per optimiser step.
    from support.tb_events import read_scalars

    server_tb = read_scalars(tmp_path / "tb" / "server")
    assert server_tb["round/updates_accepted"] == [(0, 2.0), (1, 2.0)]
    assert server_tb["round/update_bytes"] == [(0, 2.0 * block), (1, 2.0 * block)]
    for rid in robots:
        steps = [step for step, _ in read_scalars(tmp_path / "tb" / rid)["train/bc"]]
        assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 2, steps


@pytest.mark.timeout(300)
def test_topk_delta_updates_with_error_feedback_federate(tmp_path, ros_env, processes):
    """Robots send 5 % of each large tensor's changes (topk; small tensors whole) against float16
    cluster models: the server adds each delta to the model as the robots decoded it, so between
    two committed rounds a tensor changes in at most 2 k entries (two robots' kept sets), and
    nowhere else."""
    from fed_ros.core.encodings import feedback, topk
    from fed_ros.core.encodings import encoded_nbytes, roundtrip
    from fed_ros.core.rounds.store import ModelStore
    from fed_ros.learning.configuration_policy import PolicyConfig
    from fed_ros.learning.trainer import initial_state_dict

    fraction = 0.05
    robots = ROBOTS
    robot = {"update_encoding": "topk", "update_topk_fraction": fraction}
    log = _federate(tmp_path, ros_env, processes, "topk", "float16", robot)

    initial = initial_state_dict(PolicyConfig(kind="lowdim"), seed=0)
    sizes = [v.size for v in initial.values()]
    expected = topk.payload_nbytes(sizes, fraction)
    got = _accepted_sizes(log)
    assert got == [expected] * 4, (got, expected)
    # 8.5x: the tensors of up to DENSE_MAX values (2 % of the policy) travel whole
    assert encoded_nbytes(initial, "float32") / expected > 8.0
    for rid in robots:  # error feedback: what was left out waits on the robot, on disk
        residual = feedback.ErrorFeedback(tmp_path / rid / "models" / "topk_residual.npz")
        assert set(residual.residual) == set(initial) and residual.norm() > 0
    store = ModelStore(tmp_path / "server")
    before, after = store.load_round(0), store.load_round(1)
    for cid, model in after.cluster_models.items():
        base = roundtrip(before.cluster_models[cid], "float16")  # what the robots started from
        changed = 0
        for name, value in model.items():
            assert value.dtype == np.float32 and np.all(np.isfinite(value))
            moved = np.count_nonzero(value - base[name])
            assert moved <= 2 * topk.topk_count(value.size, fraction), name
            changed += moved
        assert changed > 0


@pytest.mark.timeout(300)
def test_quantized_delta_updates_federate_in_fewer_bytes_than_quantized_weights(
    tmp_path, ros_env, processes
):
    """Robots send int4_delta updates (their change since the float32 cluster model, 4-bit
    blockwise and deflated, the rounding error kept on the robot): every update is accepted, each
    one smaller than the same policy as int4_block (deflate), and the server's models stay
    float32 and finite, and move."""
    from fed_ros.core.encodings import feedback
    from fed_ros.core.encodings import encoded_nbytes
    from fed_ros.core.rounds.store import ModelStore
    from fed_ros.learning.configuration_policy import PolicyConfig
    from fed_ros.learning.trainer import initial_state_dict

    log = _federate(
        tmp_path, ros_env, processes, "int4delta", "float32", {"update_encoding": "int4_delta"}
    )
    initial = initial_state_dict(PolicyConfig(kind="lowdim"), seed=0)
    sizes = _accepted_sizes(log)
    assert len(sizes) == 4, log[-3000:]
    assert max(sizes) < encoded_nbytes(initial, "int4_block"), sizes
    assert encoded_nbytes(initial, "float32") / max(sizes) > 7.1, sizes
    for rid in ROBOTS:  # the rounding error waits on the robot, on disk
        residual = feedback.ErrorFeedback(tmp_path / rid / "models" / "topk_residual.npz")
        assert set(residual.residual) == set(initial) and residual.norm() > 0
    store = ModelStore(tmp_path / "server")
    before, after = store.load_round(0), store.load_round(1)
    for cid, model in after.cluster_models.items():
        moved = 0.0
        for name, value in model.items():
            assert value.dtype == np.float32 and np.all(np.isfinite(value)), name
            moved += float(np.abs(value - before.cluster_models[cid][name]).sum())
        assert moved > 0
