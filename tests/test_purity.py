"""The policy package must stay pure: no simpy, torch, time or random imports (DESIGN.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import ppsim.policy

FORBIDDEN = {"simpy", "torch", "time", "random"}


def imported_roots(tree: ast.AST) -> set[str]:
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_policy_package_imports_nothing_impure():
    files = sorted(Path(ppsim.policy.__file__).parent.glob("**/*.py"))
    assert len(files) >= 8
    bad = {f.name: imported_roots(ast.parse(f.read_text())) & FORBIDDEN for f in files}
    assert {k: v for k, v in bad.items() if v} == {}


def test_scanner_catches_forbidden_imports():
    tree = ast.parse("import time\nfrom random import choice\nimport numpy.random\nfrom simpy.events import Event\n")
    assert imported_roots(tree) & FORBIDDEN == {"time", "random", "simpy"}
