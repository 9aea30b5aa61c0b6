#!/usr/bin/env python3
r"""Mutation testing of the ROS-free decision code with mutmut, in a private copy.

    python test/mutation/run_mutation.py [--modules update_checks,rounds,...|all] [--dir DIR] \
        [--jobs N]

mutmut 3 rewrites the files it mutates, so this never runs in the source tree: it copies
fed_ros/ and the fast tests that exercise the chosen modules into DIR (default
build/mutation), writes a mutmut config there and runs `mutmut run` on the copy. Only the
ROS-free tests of those modules run (no ROS processes, no MuJoCo, no torch training), and
mutmut runs, per mutant, only the tests that reached the mutated function. The summary
(score per module, surviving mutants) is printed and written to DIR/summary.md.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# module (under fed_ros/core) -> the fast, ROS-free test files that exercise it
MODULES: dict[str, tuple[str, ...]] = {
    # the checks (fed_ros/core/checks)
    **{
        m: (
            "test_validation.py",
            "test_core_boundaries.py",
            "test_core_cluster_model_checks.py",
            "test_core_validation_exact.py",
        )
        for m in (
            "decisions",
            "sender_checks",
            "payload_checks",
            "update_checks",
            "descriptor_checks",
            "audit_log",
        )
    },
    **{
        m: (
            "test_auth.py",
            "test_validation.py",
            "test_core_boundaries.py",
            "test_core_auth_exact.py",
        )
        for m in ("auth", "signed_messages", "replay")
    },
    "rounds": ("test_core_rounds.py", "test_core_boundaries.py", "test_core_rounds_exact.py"),
    "roster": (
        "test_core_rounds.py",
        "test_registration.py",
        "test_core_boundaries.py",
        "test_core_rounds_exact.py",
    ),
    "round_collect": (
        "test_core_rounds.py",
        "test_core_boundaries.py",
        "test_core_rounds_exact.py",
    ),
    "round_report": ("test_core_rounds.py", "test_core_round_report_exact.py"),
    "store": ("test_core_store.py", "test_core_store_exact.py"),
    "robust": ("test_attacks.py", "test_core_boundaries.py"),
    "aggregate": (
        "test_core_params_aggregate.py",
        "test_core_strategies.py",
        "test_core_clustering_exact.py",
    ),
    "strategy": (
        "test_core_strategies.py",
        "test_core_boundaries.py",
        "test_core_strategy_exact.py",
    ),
    "strategy_types": (
        "test_core_strategies.py",
        "test_core_boundaries.py",
        "test_core_strategy_exact.py",
    ),
    "strategies": (
        "test_core_strategies.py",
        "test_core_boundaries.py",
        "test_core_clustering_exact.py",
    ),
    "cua": (
        "test_core_clustering.py",
        "test_core_strategies.py",
        "test_core_clustering_exact.py",
        "test_core_cua_exact.py",
    ),
    "srb": ("test_core_clustering.py", "test_core_strategies.py", "test_core_clustering_exact.py"),
    "fedepth": (
        "test_core_clustering.py",
        "test_core_strategies.py",
        "test_core_clustering_exact.py",
    ),
    "rnd": ("test_core_clustering.py", "test_core_strategies.py", "test_core_clustering_exact.py"),
}
# The default set: the decisions a broken fleet hinges on (about 20 min on 2 idle cores);
# `--modules all` adds aggregation and the clustering maths.
DEFAULT = (
    "decisions",
    "sender_checks",
    "payload_checks",
    "update_checks",
    "descriptor_checks",
    "audit_log",
    "auth",
    "signed_messages",
    "replay",
    "roster",
    "round_collect",
    "rounds",
    "store",
    "robust",
    "strategy",
    "strategy_types",
)
HELPERS = ("conftest.py",)


def _test_file(name: str) -> Path | None:
    """Where ``name`` lives under test/ (its tier folder, or test/ itself), or None."""
    found = sorted((REPO / "test").rglob(name))
    return found[0] if found else None


# module -> its file under fed_ros/core (one folder per concept, fed_ros/core/__init__.py);
# "strategies" is the one module per strategy.
PATHS: dict[str, tuple[str, ...]] = {
    **{
        m: (f"checks/{m}.py",)
        for m in (
            "decisions",
            "sender_checks",
            "payload_checks",
            "update_checks",
            "descriptor_checks",
            "audit_log",
        )
    },
    "auth": ("security/auth.py", "security/keys.py", "security/key_admin.py"),
    "signed_messages": ("security/signed_messages.py",),
    "replay": ("security/replay.py", "security/replay_file.py"),
    "rounds": (
        "rounds/coordinator.py",
        "rounds/settings.py",
        "rounds/answers.py",
        "rounds/announcements.py",
    ),
    "roster": ("rounds/roster.py",),
    "round_collect": ("rounds/collect.py",),
    "round_report": ("rounds/report.py",),
    "store": ("rounds/store.py", "rounds/npy_files.py"),
    "robust": ("strategies/robust.py",),
    "aggregate": ("strategies/aggregate.py",),
    "strategy": (
        "strategies/base.py",
        "strategies/prepared_round.py",
        "strategies/cluster_ids.py",
    ),
    "strategy_types": ("strategies/types.py",),
    "strategies": tuple(
        f"strategies/{m}.py" for m in ("local", "fedavg", "ifca", "feddrman", "fedepth", "rnd")
    ),
    **{m: (f"clustering/{m}.py",) for m in ("cua", "srb", "fedepth", "rnd")},
}


def _paths(module: str) -> list[str]:
    return [f"fed_ros/core/{p}" for p in PATHS[module]]


def _write_config(work: Path, modules: list[str], tests: list[str]) -> None:
    only = "\n    ".join(p for m in modules for p in _paths(m))
    selection = "\n    ".join(f"test/{t}" for t in tests)
    (work / "setup.cfg").write_text(f"""[mutmut]
source_paths = fed_ros
also_copy =
    config
    msg
only_mutate =
    {only}
pytest_add_cli_args_test_selection =
    {selection}
pytest_add_cli_args =
    -p
    no:randomly
    -p
    no:cacheprovider
    -q
use_git_change_detection = false

[tool:pytest]
addopts = -p no:randomly
markers =
    ros: starts ROS 2 processes
    sim: runs MuJoCo physics / rendering
    slow: takes more than ~30 s on 2 cores
""")


def _results(work: Path, mutmut: str) -> dict[str, str]:
    out = subprocess.run(
        [mutmut, "results", "--all", "true"], cwd=work, capture_output=True, text=True
    )
    status = {}
    for line in out.stdout.splitlines():
        m = re.match(r"\s*(\S+):\s*(\S.*)$", line)
        if m and "__mutmut_" in m.group(1):
            status[m.group(1)] = m.group(2).strip()
    return status


def _module_of(mutant: str) -> str:
    path = mutant.split(".x_")[0].split(".xǁ")[0]
    parts = path.split(".")
    return "strategies" if "strategies" in parts else parts[2] if len(parts) > 2 else path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--modules",
        default=",".join(DEFAULT),
        help=f"comma-separated from {sorted(MODULES)}, or 'all' (default: {','.join(DEFAULT)})",
    )
    parser.add_argument(
        "--dir", default=str(REPO / "build" / "mutation"), help="private work directory"
    )
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 2, help="parallel mutant workers"
    )
    parser.add_argument(
        "--rerun-survivors",
        action="store_true",
        help="keep DIR's earlier results, copy the current tests in and re-test only "
        "the mutants that survived there (after adding tests that kill them)",
    )
    args = parser.parse_args(argv)
    modules = (
        sorted(MODULES)
        if args.modules == "all"
        else [m.strip() for m in args.modules.split(",") if m]
    )
    unknown = [m for m in modules if m not in MODULES]
    if unknown:
        parser.error(f"unknown modules {unknown}; choose from {sorted(MODULES)}")
    # A listed file that does not exist (yet) is left out: tests of a module may be added later.
    tests = sorted({t for m in modules for t in MODULES[m] if _test_file(t) is not None})

    work = Path(args.dir).resolve()
    if work == REPO or REPO in work.parents and work.parent == REPO:
        parser.error("--dir must be a private directory, not the source tree")
    mutmut = str(Path(sys.executable).with_name("mutmut"))
    rerun: list[str] = []
    if args.rerun_survivors:
        if not (work / "mutants").is_dir():
            parser.error(f"--rerun-survivors: {work} holds no earlier mutmut run")
        rerun = sorted(n for n, v in _results(work, mutmut).items() if v == "survived")
        # The copied sources stay (mutmut's mutants/ were made from them); tests are refreshed.
        shutil.rmtree(work / "test", ignore_errors=True)
        shutil.rmtree(work / "mutants" / "test", ignore_errors=True)
        if not rerun:
            print(f"mutation: no survivors in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(
            REPO / "fed_ros",
            work / "fed_ros",
            ignore=shutil.ignore_patterns("__pycache__", "msg", "srv"),
        )
        # test_auth checks the shipped SROS2 policy (config/security) against the node code;
        # the validation tests check the encoding constants against msg/TensorPayload.msg.
        shutil.copytree(REPO / "config", work / "config")
        shutil.copytree(REPO / "msg", work / "msg")
    (work / "test").mkdir(parents=True)
    for name in tests + list(HELPERS):
        # Flat in the copy: the mutated tests are unit-tier files, and the tier only sets a marker.
        shutil.copy2(_test_file(name), work / "test" / name)
    _write_config(work, modules, tests)

    env = dict(
        os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"), PYTHONDONTWRITEBYTECODE="1"
    )
    print(
        f"mutation: {', '.join(modules)} in {work}; tests: {' '.join(tests)}"
        + (f"; re-testing {len(rerun)} survivors" if args.rerun_survivors else ""),
        flush=True,
    )
    run = subprocess.CompletedProcess([], 0)
    if rerun or not args.rerun_survivors:  # with no survivors there is nothing to re-test
        # mutmut redraws a progress spinner many times a second: keep that in a log file.
        with open(work / "mutmut.log", "w") as log:
            run = subprocess.run(
                [mutmut, "run", "--max-children", str(args.jobs), *rerun],
                cwd=work,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        tail = (work / "mutmut.log").read_text(errors="replace").replace("\r", "\n").splitlines()
        print("\n".join(line for line in tail[-40:] if "⠋" not in line and line.strip())[-4000:])
    status = _results(work, mutmut)
    if not status:
        print("mutation: mutmut reported no mutants", file=sys.stderr)
        return run.returncode or 1

    per = collections.defaultdict(collections.Counter)
    for name, verdict in status.items():
        per[_module_of(name)][verdict] += 1
    lines = [
        "| module | mutants | killed | survived | other | score |",
        "|---|---|---|---|---|---|",
    ]
    total = collections.Counter()
    for mod in sorted(per):
        c = per[mod]
        total.update(c)
        killed = c["killed"] + c["timeout"]
        tested = sum(c.values()) - c["skipped"] - c["not checked"]
        other = tested - killed - c["survived"]
        lines.append(
            f"| {mod} | {tested} | {killed} | {c['survived']} | {other} | "
            f"{100 * killed / max(tested, 1):.1f} % |"
        )
    killed = total["killed"] + total["timeout"]
    tested = sum(total.values()) - total["skipped"] - total["not checked"]
    lines.append(
        f"| **all** | {tested} | {killed} | {total['survived']} | "
        f"{tested - killed - total['survived']} | **{100 * killed / max(tested, 1):.1f} %** |"
    )
    survivors = sorted(n for n, v in status.items() if v == "survived")
    lines += [
        "",
        f"Surviving mutants ({len(survivors)}; `cd {work} && {mutmut} show <name>` shows the "
        "diff):",
    ]
    lines += [f"- `{n}`" for n in survivors]
    text = "\n".join(lines) + "\n"
    (work / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
