"""Shared fixtures. ROS tests: loopback discovery, an exclusive domain id per test, and every
process started is reaped; `wait_until` for condition waits with a deadline."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", "egl")

REPO_ROOT = Path(__file__).resolve().parents[1]
TEST_ROOT = Path(__file__).resolve().parent


# Fast DDS puts domain d on UDP ports 7400 + 250 d + 10 + 2 p (participant p): ids above 101
# reach Linux's ephemeral range (32768-60999), where any socket of the machine can hold the port.
from fed_ros.ros.rigs.domains import DOMAIN_IDS, DOMAIN_LOCK_DIR, exclusive_domain_id  # noqa: E402,F401


# The tiers are folders; each sets its tests' marker, so `-m unit` (make test-fast) or `-m "not
# slow"` selects by tier without a hand-kept list of files.
TIER_MARKERS = {"unit": "unit", "learning": "learning", "sim": "sim", "dds": "ros", "slow": "slow"}
# `make test` runs two workers, one file at a time each: the heaviest tiers start first, so both
# workers finish together instead of one running a fleet or the colcon build alone at the end.
TIER_ORDER = ("slow", "dds", "sim", "learning", "unit")


def _tier(item) -> str | None:
    parts = Path(item.path).relative_to(TEST_ROOT).parts
    return parts[0] if len(parts) > 1 and parts[0] in TIER_MARKERS else None


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        tier = _tier(item)
        if tier is not None:
            item.add_marker(TIER_MARKERS[tier])
    if (
        config.pluginmanager.has_plugin("randomly")
        and config.getoption("randomly_seed", None) is not None
    ):
        return
    rank = {tier: i for i, tier in enumerate(TIER_ORDER)}
    # Stable: the file order within a tier is kept.
    items.sort(key=lambda item: rank.get(_tier(item) or "", len(rank)))


@pytest.fixture(autouse=True)
def _torch_seeded_per_test() -> Iterator[None]:
    """Seed torch's global RNG before every test, as pytest-randomly does for random and numpy.

    Without it a test drawing from the global torch RNG saw a state set by whichever tests ran
    before it in its worker, so its data changed with the order (a random-order run failed one
    that way). Only when torch is already imported: the pure tests stay free of torch.
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(0)
    yield


# Variables that redirect every later ROS process of the worker: a test that leaves one set
# breaks discovery for the tests after it in that worker.
ROS_ROUTING_VARIABLES = (
    "ROS_DISCOVERY_SERVER",
    "ROS_SUPER_CLIENT",
    "FASTDDS_DEFAULT_PROFILES_FILE",
)


@pytest.fixture(autouse=True)
def _ros_routing_environment_restored() -> Iterator[None]:
    """Put the ROS routing variables back as they were before each test.

    launch's ``SetEnvironmentVariable`` writes ``os.environ`` itself (its context's environment
    is the process's), so a test that visited a launch description with a Discovery Server left
    ``ROS_DISCOVERY_SERVER`` pointing at a server that never ran, and 12 later tests of that
    xdist worker found no node (CI of b798700: "no arm reset service 'arm/reset' after 60 s").
    """
    before = {name: os.environ.get(name) for name in ROS_ROUTING_VARIABLES}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def _scheduling_policy_kept() -> Iterator[None]:
    """Fail a test that leaves its worker at another CPU scheduling policy, and put it back.

    Every later test of the worker and every process they start inherit the policy. SVT-AV1's
    encoder set SCHED_FIFO 99 on the thread that opened it (root may). The fleet nodes started
    after that spun at real-time priority, load reached 76, rounds timed out, and one
    FleetMonitor close never returned (CI killed at 90 min; test_lerobot_dataset's AV1 case
    now encodes in a child process).
    """
    before = os.sched_getscheduler(0), os.sched_getparam(0).sched_priority
    yield
    after = os.sched_getscheduler(0), os.sched_getparam(0).sched_priority
    if after != before:
        os.sched_setscheduler(0, before[0], os.sched_param(before[1]))
        pytest.fail(
            f"the test left this process at scheduling policy {after[0]} priority {after[1]} "
            f"(was {before[0]} priority {before[1]}); every later test and child would inherit it",
            pytrace=False,
        )


def default_sigint() -> None:
    """In a child before exec: SIGINT back to its default action.

    A test run started as a background job of a non-interactive shell (nohup, CI runners)
    inherits SIGINT *ignored*, and programs that keep the inherited disposition (`ros2 launch`,
    `fed-ros status --watch`) then never see the Ctrl-C a test sends them
    (../shared/tools/ros2-launch/README.md). Measured: both hung after SIGINT in such a run.
    """
    import signal as _signal

    _signal.signal(_signal.SIGINT, _signal.SIG_DFL)


def wait_until(
    predicate: Callable[[], object],
    timeout: float,
    what: str,
    interval: float = 0.02,
    diagnostics: Callable[[], str] | None = None,
) -> object:
    """Poll `predicate` until it returns something truthy (returned) or `timeout` s passed.

    The deadline only bounds a wait for a condition; it is never what a test asserts.
    On timeout: AssertionError naming `what`, plus `diagnostics()` (e.g. a log tail).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            extra = f"\n{diagnostics()}" if diagnostics is not None else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{extra}")
        time.sleep(interval)


@pytest.fixture
def ros_domain_id() -> Iterator[int]:
    """An exclusive ROS domain id for one test (released after its processes were reaped)."""
    with exclusive_domain_id() as domain:
        yield domain


@pytest.fixture
def ros_env(monkeypatch, ros_domain_id) -> dict[str, str]:
    """Environment for ROS processes of one test: LOCALHOST discovery and an exclusive domain id.

    Also applied to this process, so in-process rclpy contexts join the same domain.
    """
    domain = str(ros_domain_id)
    monkeypatch.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    monkeypatch.setenv("ROS_DOMAIN_ID", domain)
    monkeypatch.delenv("ROS_LOCALHOST_ONLY", raising=False)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class ProcessGroup:
    """Starts processes in their own session and always kills them (SIGINT, then SIGKILL)."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(
        self, args: list[str], env: dict[str, str], log_path: Path | None = None, **kwargs
    ) -> subprocess.Popen:
        out = open(log_path, "wb") if log_path else subprocess.DEVNULL
        kwargs.setdefault("preexec_fn", default_sigint)
        proc = subprocess.Popen(
            args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **kwargs
        )
        self.procs.append(proc)
        return proc

    def python(self, code_or_module: list[str], env: dict[str, str], **kwargs) -> subprocess.Popen:
        return self.start([sys.executable, *code_or_module], env, **kwargs)

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGINT)
                except ProcessLookupError:
                    pass
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=5)


@pytest.fixture
def processes(ros_domain_id):
    """A ProcessGroup reaped at the end of the test, whatever happens.

    Depends on ros_domain_id so the domain stays locked until these processes are dead.
    """
    group = ProcessGroup()
    try:
        yield group
    finally:
        group.kill_all()


@pytest.fixture(scope="module")
def torch_one_thread():
    """One intra-op torch thread for a module: threads thrash on a loaded 2-core machine
    and the test models are tiny anyway."""
    import torch  # imported here so ROS-only test runs never pay for torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


# ROS fixtures several test files share (their helpers are in test/support/); rclpy is imported
# inside them, so the ROS-free tiers never load it.
@pytest.fixture
def ros_context(ros_env):
    """An rclpy context with a two-thread executor; ``make(name)`` adds a node to it."""
    import rclpy
    from rclpy.executors import MultiThreadedExecutor

    context = rclpy.Context()
    rclpy.init(context=context)
    executor = MultiThreadedExecutor(num_threads=2, context=context)
    nodes = []

    def make(name):
        node = rclpy.create_node(name, context=context)
        executor.add_node(node)
        nodes.append(node)
        return node

    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    try:
        yield make
    finally:
        executor.shutdown()
        for node in nodes:
            node.destroy_node()
        rclpy.try_shutdown(context=context)
        spinner.join(timeout=5)


@pytest.fixture(params=[True, False], ids=["lockstep", "free-running"])
def adapter(request, ros_env, monkeypatch):
    """A panda_sim adapter without cameras, driven by direct callback calls (the tick and hand-back
    tests)."""
    import rclpy
    from rclpy.parameter import Parameter
    from support.adapter_ticks import FakeClock

    from fed_ros.ros.nodes.arm_adapter import arm_adapter_node as mod

    clock = FakeClock()
    monkeypatch.setattr(mod, "time", clock)
    context = rclpy.Context()
    rclpy.init(context=context)
    node = mod.ArmAdapterNode(
        context=context,
        parameter_overrides=[
            Parameter("lockstep", value=request.param),
            Parameter("cameras", value=False),
            Parameter("state_timeout_s", value=0.5),
            Parameter("max_episode_steps", value=50),
        ],
    )
    try:
        yield node, clock
    finally:
        node.destroy_node()
        rclpy.try_shutdown(context=context)
