"""Node constructors wire collaborators in order: no lambda stands in for an attribute the
constructor creates later (issue 38), except where two collaborators need each other."""

from __future__ import annotations

import ast
from pathlib import Path

NODES = Path(__file__).resolve().parents[2] / "fed_ros" / "ros" / "nodes"
# (node file, attribute) -> why a lambda must look it up later.
CYCLES = {
    ("server/server_node.py", "rounds"): "the round driver takes the encoder, which reads the "
    "driver's tracker",
}


def forward_lambdas(source: str) -> list[tuple[int, str]]:
    """(line, attribute) of each lambda in an ``__init__`` that reads ``self.<attribute>``
    where the constructor first assigns that attribute further down."""
    found = []
    for cls in ast.parse(source).body:
        if not isinstance(cls, ast.ClassDef):
            continue
        for init in cls.body:
            if not (isinstance(init, ast.FunctionDef) and init.name == "__init__"):
                continue
            assigned: dict[str, int] = {}
            for node in ast.walk(init):
                targets = (
                    node.targets
                    if isinstance(node, ast.Assign)
                    else [node.target]
                    if isinstance(node, ast.AnnAssign)
                    else []
                )
                for target in targets:
                    for el in target.elts if isinstance(target, ast.Tuple) else [target]:
                        if isinstance(el, ast.Attribute) and getattr(el.value, "id", "") == "self":
                            assigned[el.attr] = min(assigned.get(el.attr, node.lineno), node.lineno)
            for node in ast.walk(init):
                if isinstance(node, ast.Lambda):
                    for a in ast.walk(node.body):
                        if (
                            isinstance(a, ast.Attribute)
                            and getattr(a.value, "id", "") == "self"
                            and assigned.get(a.attr, 0) > node.lineno
                        ):
                            found.append((node.lineno, a.attr))
    return found


def test_no_node_constructor_reads_a_later_attribute_through_a_lambda():
    bad = [
        f"{path.relative_to(NODES)}:{line}: lambda reads self.{attr}, assigned later"
        for path in sorted(NODES.rglob("*_node.py"))
        for line, attr in forward_lambdas(path.read_text())
        if (str(path.relative_to(NODES)), attr) not in CYCLES
    ]
    assert not bad, "\n".join(bad)


def test_the_scan_finds_a_forward_lambda():
    source = (
        "class N:\n"
        "    def __init__(self):\n"
        "        self.a = A(publish=lambda m: self.pub.publish(m))\n"
        "        self.pub = make()\n"
    )
    assert forward_lambdas(source) == [(3, "pub")]
