"""The Python is formatted and linted as pyproject.toml's [tool.ruff] says, the C and C++ as
.clang-format says (ruff and clang-format are in the Makefile's test deps): `ruff format`,
`ruff check --fix` and `clang-format -i` repair what this finds."""

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = str(pathlib.Path(sys.executable).parent)
RUFF = shutil.which("ruff", path=BIN) or shutil.which("ruff")
CLANG_FORMAT = shutil.which("clang-format", path=BIN) or shutil.which("clang-format")
C_SOURCES = ["csrc/*.h", "csrc/*.cpp", "csrc/*.cu", "csrc/*.cuh", "examples/*.c", "bench/*.cpp", "bench/*.c"]


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]])
def test_ruff(command):
    assert RUFF, "ruff is not installed (make setup installs it)"
    r = subprocess.run([RUFF, *command, "."], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_clang_format():
    assert CLANG_FORMAT, "clang-format is not installed (make setup installs it)"
    files = subprocess.run(["git", "ls-files", *C_SOURCES], cwd=ROOT, capture_output=True, text=True, check=True)
    files = files.stdout.split()
    assert len(files) > 50, files  # the sources are there: the check cannot pass on nothing
    r = subprocess.run([CLANG_FORMAT, "--dry-run", "-Werror", *files], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
