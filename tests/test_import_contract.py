"""Layering: the policy is pure, the engine and the simulator do not import each other.

Imports are read from the source (every ``import`` statement, including those inside functions),
followed transitively through the project's own packages, so a lazy import counts as much as a
top-level one (except in the command-line hub, see ``TOP_LEVEL_ONLY``) and no optional dependency
(torch) needs to be installed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ppsim", "engine", "calibration")
# the command-line hub imports each command's package inside that command's handler; reaching the
# hub (for its shared flag definitions) runs only its module-level imports
TOP_LEVEL_ONLY = {"ppsim.cli"}


def _module_file(name: str) -> Path | None:
    base = ROOT.joinpath(*name.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def _imports(path: Path, module: str) -> set[str]:
    """Absolute names of everything ``path`` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    nodes = tree.body if module in TOP_LEVEL_ONLY else list(ast.walk(tree))
    pkg = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = pkg.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)  # `from pkg import submodule`
    return out


def closure(start: list[str], resolve=_module_file) -> set[str]:  # noqa: ANN001
    """Every module reachable from ``start``; project modules are followed, others only named."""
    seen: set[str] = set()
    todo = list(start)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name.split(".")[0] not in PACKAGES:
            continue
        path = resolve(name)
        if path is None:
            continue
        parents = [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]
        todo.extend(parents)  # importing a.b.c runs a/__init__ and a/b/__init__
        todo.extend(_imports(path, name))
    return {m for m in seen if m.split(".")[0] not in PACKAGES or resolve(m) is not None}


def modules_of(package: str) -> list[str]:
    d = ROOT / package.replace(".", "/")
    return [".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__") for p in d.rglob("*.py")]


def _offenders(mods: set[str], banned: tuple[str, ...]) -> list[str]:
    return sorted(m for m in mods if any(m == b or m.startswith(b + ".") for b in banned))


def test_policy_imports_no_executor_cost_or_simpy() -> None:
    mods = closure(modules_of("ppsim.policy"))
    assert not _offenders(mods, ("simpy", "ppsim.sim", "ppsim.cost", "engine", "torch", "ppsim.run"))


def test_engine_never_imports_the_simulator() -> None:
    mods = closure(modules_of("engine"))
    assert not _offenders(mods, ("ppsim.sim", "ppsim.run", "simpy"))


def test_simulator_never_imports_the_engine() -> None:
    mods = closure(modules_of("ppsim.sim") + ["ppsim.run", "ppsim.deployment"])
    assert not _offenders(mods, ("engine", "torch"))


def test_deployment_is_executor_free() -> None:
    mods = closure(["ppsim.deployment"])
    assert not _offenders(mods, ("simpy", "ppsim.sim", "engine", "torch"))


@pytest.mark.parametrize("bad", ["ppsim.sim.executor", "simpy"])
def test_the_check_sees_a_violation(bad: str, tmp_path: Path) -> None:
    """The closure follows imports, lazy ones included: a policy module importing ``bad`` is caught."""
    probe = tmp_path / "probe.py"
    probe.write_text(f"def f():\n    import {bad}\n")
    name = "ppsim.policy._contract_probe"
    mods = closure([name], lambda n: probe if n == name else _module_file(n))
    assert _offenders(mods, (bad,)) == [bad] if bad == "simpy" else bad in _offenders(mods, ("ppsim.sim",))
