"""Shrink the mypy baseline in pyproject.toml to the errors that are still there.

The baseline (between the ``mypy baseline`` markers) lists, per module, the error codes mypy
found when it came into ``make lint`` (issue 38). After fixing some, run

    .venv/bin/python tools/mypy_baseline.py

It runs mypy without the baseline and writes it back with only the (module, code) pairs that
were listed before and still fail: the list never grows, so a new error stays an error.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
BEGIN = "# --- mypy baseline: BEGIN"
END = "# --- mypy baseline: END"
HEADER = [
    "# Errors found when the checker came in (issue 38), by module and error code: each entry is",
    "# debt to pay off, not a rule; a fixed module leaves its list, a new module is checked in",
    "# full. tools/mypy_baseline.py shrinks it after fixes (it never adds an entry).",
]
ERROR = re.compile(r"^(fed_ros/[^:]+\.py):\d+: error: .*\[([a-z-]+)\]$")


def read_baseline(text: str) -> dict[str, set[str]]:
    """module -> error codes listed between the markers."""
    block = text[text.index(BEGIN) : text.index(END)]
    listed: dict[str, set[str]] = defaultdict(set)
    for section in block.split("[[tool.mypy.overrides]]")[1:]:
        modules, codes = section.split("disable_error_code")
        for module in re.findall(r'"([^"]+)",', modules):
            listed[module].update(re.findall(r'"([^"]+)"', codes))
    return listed


def module_of(path: str) -> str:
    return path[: -len(".py")].replace("/", ".").removesuffix(".__init__")


def render(listed: dict[str, set[str]]) -> str:
    """The baseline block: one override per set of codes, modules sorted."""
    groups: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for module, codes in listed.items():
        groups[tuple(sorted(codes))].append(module)
    lines = [BEGIN, *HEADER]
    for codes, modules in sorted(groups.items(), key=lambda item: sorted(item[1])[0]):
        lines += ["[[tool.mypy.overrides]]", "module = ["]
        lines += [f'    "{module}",' for module in sorted(modules)]
        lines += ["]", "disable_error_code = [" + ", ".join(f'"{c}"' for c in codes) + "]"]
    return "\n".join([*lines, END]) + "\n"


def main() -> int:
    text = PYPROJECT.read_text()
    listed = read_baseline(text)
    start, end = text.index(BEGIN), text.index(END) + len(END) + 1
    without = text[:start].rstrip("\n") + "\n"
    PYPROJECT.write_text(without)
    try:
        run = subprocess.run(
            [sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True
        )
    finally:
        PYPROJECT.write_text(text)  # an interrupted run leaves the old baseline, never none
    still: dict[str, set[str]] = defaultdict(set)
    for line in run.stdout.splitlines():
        match = ERROR.match(line)
        if match and match.group(2) in listed.get(module_of(match.group(1)), ()):
            still[module_of(match.group(1))].add(match.group(2))
    PYPROJECT.write_text(text[:start] + render(still) + text[end:])
    before = sum(len(c) for c in listed.values())
    after = sum(len(c) for c in still.values())
    print(f"mypy baseline: {before} -> {after} (module, code) entries in {len(still)} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
