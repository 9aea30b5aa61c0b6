"""Reusable pieces for tests that run a signed fleet over real DDS (issue 13 hostile peers,
issue 17 signed fleet of real nodes). They live in the package (`fed_ros.ros.fleet.scripted`)
because `fed-ros bench robustness --protocol` runs the same fleet; this module keeps the tests'
import path. Use with the conftest fixtures ``ros_env`` and ``processes``::

    keys = make_keys(tmp_path, ROBOTS)
    server = processes.start(server_argv(tmp_path, ROBOTS, rounds=3), ros_env, log_path=...)
    robots = ScriptedRobots(keys, ROBOTS); robots.register_all(); robots.run_until_done(...)
"""
from __future__ import annotations

from fed_ros.ros.fleet.scripted import (ROBOTS, ScriptedRobots, committed_models, honest_update,  # noqa: F401
                                        initial_model, make_keys, reference_models, rss_mb, server_argv,
                                        wait_for)
