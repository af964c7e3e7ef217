"""Installing grpo_jax into a venv leaves the source tree unchanged (issue 20): the build
backend works out of tree. Built from a copy of the tracked files, so the check does not
depend on what earlier installs left in this checkout."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def _tracked(root: Path) -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True,
                         check=True).stdout
    return [line for line in out.splitlines() if line]


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_building_the_wheel_writes_nothing_into_the_source(tmp_path):
    src = tmp_path / "src"
    for rel in _tracked(HERE):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(HERE / rel, src / rel)
    before = _tree(src)
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "--disable-pip-version-check", "-w", str(wheels),
                    str(src)], check=True, env={**os.environ, "PIP_NO_INPUT": "1"})
    assert [p.name for p in wheels.iterdir()] == ["grpo_jax-0.1.0-py3-none-any.whl"]
    assert _tree(src) - before == set(), sorted(_tree(src) - before)
