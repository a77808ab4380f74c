"""The README's two commands are what users and CI run: CI calls the test command verbatim, the
first command installs no optional group, and the links of the front page and docs/ resolve."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
# Pages other helpers of issue 15's round write; drop this set once they are merged.


def _bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)\n```", text, flags=re.S)


def test_ci_runs_the_readme_test_command_verbatim():
    setup, tests = _bash_blocks(README)[:2]
    assert "pytest" in tests and "pytest" not in setup
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert tests in ci
    assert ci.index(".venv/bin/ruff format --check .") < ci.index(tests)


def test_first_command_installs_the_simulator_without_torch_or_ray():
    setup = _bash_blocks(README)[0]
    assert "pip install -q -e . " in setup and "[" not in setup and "torch" not in setup
    assert setup.endswith("ppsim simulate")
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not [d for d in deps if re.match(r"(torch|ray|safetensors|pytest|hypothesis)\b", d)]


def test_front_page_is_short():
    assert len(README.splitlines()) <= 200


def test_relative_links_resolve():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            path = (page.parent / target).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken
