"""The load-time torch version check (mtp_kernels/_torch_version.py, docs/torch-versions.md)
and what makes one build serve later torch releases: the extension imports only torch's
stable C ABI.

A build serves the torch major.minor it was built against and later ones; the build records
its torch and importing the package under an older one raises an ImportError that names both
and says what to do, before the extension is loaded. Tested without a second torch: the
recorded version is replaced in a subprocess.
"""

import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from mtp_kernels import _torch_version as tv


@pytest.mark.parametrize(
    "built, running",
    [
        ("2.13.0", "2.13.0"),
        ("2.13.0+cpu", "2.13.1+cu130"),  # patch releases and local tags
        ("2.13.0", "2.13.0a0+git1234"),
        ("2.13.0+cpu", "2.14.1+cu130"),  # later releases: the stable ABI
        ("2.13.0", "2.20.0"),
        ("2.13.0", "3.0.0"),
        (None, "2.13.0"),  # a build that recorded nothing: not checked
        ("", "2.13.0"),
    ],
)
def test_same_or_later_torch_loads(built, running):
    assert tv.mismatch_error(built, running) is None


@pytest.mark.parametrize(
    "built, running",
    [
        ("2.13.0", "2.12.0"),
        ("2.14.1+cu130", "2.13.0+cpu"),
        ("2.13.0", "2.1.3"),
        ("2.13.0", "1.13.0"),
        ("x", "2.13.0"),
        ("2.13.0", "nightly"),
    ],
)
def test_older_torch_is_refused(built, running):
    msg = tv.mismatch_error(built, running)
    assert msg is not None
    assert f"built against torch {built}" in msg and f"torch {running} is installed" in msg
    assert "pip install --no-build-isolation -e ." in msg and tv.ALLOW_ENV in msg
    if built != "x":
        assert f"it needs torch >= {built[:4]}" in msg


def test_major_minor():
    assert tv.major_minor("2.13.0+cpu") == (2, 13)
    assert tv.major_minor("2.14.0.dev20261001+cu130") == (2, 14)
    assert tv.major_minor("nightly") is None


def test_build_recorded_the_installed_torch():
    built = tv.built_torch_version()
    assert built is not None, "no mtp_kernels/_build_info.py: rebuild (pip install --no-build-isolation -e .)"
    assert built == torch.__version__


def _import_with_recorded(version: str, tmp_path, allow: bool = False) -> subprocess.CompletedProcess:
    # A fake _build_info in sys.modules stands for a build against `version`; cwd is elsewhere
    # so that the installed package is the one imported.
    code = textwrap.dedent(f"""
        import sys, types, warnings
        info = types.ModuleType("mtp_kernels._build_info")
        info.TORCH_VERSION = {version!r}
        sys.modules["mtp_kernels._build_info"] = info
        warnings.simplefilter("always")
        try:
            import mtp_kernels
        except ImportError as e:
            print("IMPORT_ERROR", e)
            print("EXTENSION_LOADED", "mtp_kernels._C" in sys.modules)
            sys.exit(3)
        print("LOADED", mtp_kernels.get_isa())
    """)
    env = {k: v for k, v in os.environ.items() if k != tv.ALLOW_ENV}
    if allow:
        env[tv.ALLOW_ENV] = "1"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )


def test_import_refuses_an_older_torch(tmp_path):
    r = _import_with_recorded("2.99.0+cpu", tmp_path)  # as if built against a torch newer than this one
    assert r.returncode == 3, r.stdout + r.stderr
    assert f"built against torch 2.99.0+cpu, but torch {torch.__version__} is installed" in r.stdout
    assert "pip install --no-build-isolation -e ." in r.stdout
    assert "EXTENSION_LOADED False" in r.stdout  # refused before the extension was loaded


def test_import_override_loads_with_a_warning(tmp_path):
    r = _import_with_recorded("2.99.0+cpu", tmp_path, allow=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "LOADED" in r.stdout
    assert "RuntimeWarning" in r.stderr and "built against torch 2.99.0+cpu" in r.stderr


@pytest.mark.parametrize("recorded", ["{major}.{minor}.99+other", "2.1.0", "{major}.{minor_before}.0"])
def test_import_same_or_older_recorded_loads(recorded, tmp_path):
    major, minor = tv.major_minor(torch.__version__)
    r = _import_with_recorded(recorded.format(major=major, minor=minor, minor_before=minor - 1), tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "LOADED" in r.stdout


def _extension_path() -> str:
    import mtp_kernels._C as ext

    return ext.__file__


# The C shim functions of the stable ABI (torch/csrc/stable/c/shim.h,
# torch/csrc/inductor/aoti_torch/c/shim.h): C names, kept by later torch releases.
STABLE_SYMBOL = re.compile(r"^(aoti_torch_|torch_)\w+$")


def _undefined_symbols(path: str, demangle: bool = False) -> list[str]:
    out = subprocess.run(
        ["nm", "-D", "--undefined-only", *(["-C"] if demangle else []), path],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    # "                 U name@VERSION" (demangled names have spaces: everything after the "U")
    return [line.split(" U ", 1)[1].split("@")[0].strip() for line in out.splitlines() if " U " in line]


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm (binutils)")
def test_extension_imports_no_torch_cpp_symbol():
    # One C++ symbol of torch (at::, c10::, torch::, caffe2::) ties the build to one torch
    # release; the stable ABI's functions are plain C names.
    path = _extension_path()
    torch_cpp = [s for s in _undefined_symbols(path, demangle=True) if re.search(r"\b(c10|at|torch|caffe2)::", s)]
    assert not torch_cpp, f"{len(torch_cpp)} C++ symbols of torch, e.g. {torch_cpp[:5]}"
    torch_c = [s for s in _undefined_symbols(path) if s.startswith(("aoti_", "torch_"))]
    assert torch_c, "no stable-ABI symbol at all: is this the torch extension?"
    assert all(STABLE_SYMBOL.match(s) for s in torch_c), torch_c


def test_extension_is_abi3():
    # The limited API: one build for every CPython >= 3.10.
    assert _extension_path().endswith(".abi3.so"), _extension_path()
