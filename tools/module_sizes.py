"""Report the package's modules over a size worth a second look (``make lint`` runs it).

A report, not a failure: a module's size follows its concept, so a long module that holds one
concept stays whole, and a short one never exists only to stay under a number (issue 38: the
old hard 400/300-line cap drove splits into 40-line modules). The report names the long ones so
a reader can ask whether each still holds one concept; node executables are listed above a
lower mark because a node file should read as a thin node.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

MODULE_REPORT_LINES = 500
NODE_REPORT_LINES = 300


def module_sizes(package: Path) -> dict[str, int]:
    """Lines per module of ``package``, keyed by dotted module name."""
    root = package.parent
    sizes = {}
    for path in sorted(package.rglob("*.py")):
        name = ".".join(path.relative_to(root).with_suffix("").parts)
        sizes[name] = len(path.read_text(encoding="utf-8").splitlines())
    return sizes


def over_report(
    sizes: dict[str, int],
    module_lines: int = MODULE_REPORT_LINES,
    node_lines: int = NODE_REPORT_LINES,
) -> list[str]:
    """Report lines: modules over ``module_lines``, node executables over ``node_lines``."""
    lines = [
        f"{name}: {n} lines (over {module_lines}: one concept still?)"
        for name, n in sorted(sizes.items(), key=lambda kv: -kv[1])
        if n > module_lines
    ]
    lines += [
        f"{name}: {n} lines (node executable over {node_lines}: still a thin node?)"
        for name, n in sorted(sizes.items(), key=lambda kv: -kv[1])
        if name.endswith("_node") and ".nodes." in name and node_lines < n <= module_lines
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    """Print the report; always exits 0 (it informs, the reviewer decides)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", nargs="?", default="fed_ros", type=Path)
    args = parser.parse_args(argv)
    report = over_report(module_sizes(args.package))
    print(f"module sizes: {len(report)} to look at" + (":" if report else ""))
    for line in report:
        print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
