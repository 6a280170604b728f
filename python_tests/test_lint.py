"""The Python is formatted and linted as pyproject.toml's [tool.ruff] says (ruff is in the
Makefile's test deps): `ruff format` and `ruff check --fix` repair what this finds."""

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
RUFF = shutil.which("ruff", path=str(pathlib.Path(sys.executable).parent)) or shutil.which("ruff")


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]])
def test_ruff(command):
    assert RUFF, "ruff is not installed (make setup installs it)"
    r = subprocess.run([RUFF, *command, "."], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
