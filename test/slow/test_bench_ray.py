"""`fed-ros bench federation --ray`: the cells as Ray tasks on a local Ray instance give the
same cell results as `--jobs 1` (the same cells, seeds and report), cached cells are never
submitted, and without Ray the command says which extra to install."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from fed_ros.bench.federation import command as F

ARGV = ["--quick", "--only", "cross", "--methods", "fedavg", "feddrman", "--robots", "2"]
ARGV += ["--demos", "2", "--rounds", "1", "--local-steps", "2", "--eval-episodes", "1"]
# Wall and CPU times differ run to run; everything else in a cell record must not.
TIMING = {"wall_s", "cpu_s", "eval_s", "eval_cpu_s", "train_s", "aggregate_cpu_s", "cluster_cpu_s"}


def _strip(x):
    if isinstance(x, dict):
        return {k: _strip(v) for k, v in x.items() if k not in TIMING and "cpu_s" not in k}
    if isinstance(x, list):
        return [_strip(v) for v in x]
    return x


def _cells(out):
    return {p.name: _strip(json.loads(p.read_text())) for p in sorted((out / "cells").glob("*"))}


@pytest.mark.sim
@pytest.mark.timeout(900)
def test_ray_cells_equal_serial_cells_and_the_cache_is_respected(tmp_path, caplog):
    serial, ray_out = tmp_path / "serial", tmp_path / "ray"
    assert F.main([*ARGV, "--jobs", "1", "--out", str(serial)]) == 0
    with caplog.at_level(logging.INFO, logger="fed_ros.bench.federation"):
        assert F.main([*ARGV, "--ray", "--jobs", "2", "--out", str(ray_out)]) == 0
    assert "ray: 2 cell tasks submitted to local Ray (2 CPUs)" in caplog.text
    caplog.clear()
    a, b = _cells(serial), _cells(ray_out)
    assert set(a) == {"cross_family__fedavg__s0.json", "cross_family__feddrman__s0.json"}
    assert a == b
    assert "cross_family" in (ray_out / "report.md").read_text()
    with caplog.at_level(logging.INFO, logger="fed_ros.bench.federation"):
        assert F.main([*ARGV, "--ray", "--out", str(ray_out)]) == 0  # every cell cached
    assert "ray: 0 cell tasks submitted" in caplog.text


def test_without_ray_the_command_names_the_extra_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails
    out = tmp_path / "out"
    assert F.main([*ARGV, "--ray", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "fed-ros bench federation: error: --ray needs ray: "
        "pip install 'fed_ros[ray]' (or: pip install ray)"
    )
    assert not out.exists()
