"""The load-time torch version check (mtp_kernels/_torch_version.py, docs/torch-versions.md).

A build serves one torch major.minor; the build records its torch and importing the package
under another raises an ImportError that names both and says how to rebuild, before the
extension is loaded. Tested without a second torch: the recorded version is replaced in a
subprocess.
"""

import os
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
        ("2.13.0+cpu", "2.13.1+cu130"),  # patch releases and local tags: the same C++ ABI
        ("2.13.0", "2.13.0a0+git1234"),
        (None, "2.13.0"),  # a build that recorded nothing: not checked
        ("", "2.13.0"),
    ],
)
def test_same_major_minor_loads(built, running):
    assert tv.mismatch_error(built, running) is None


@pytest.mark.parametrize(
    "built, running",
    [("2.13.0+cpu", "2.14.1+cu130"), ("2.13.0", "2.12.0"), ("2.13.0", "3.13.0"), ("2.13.0", "2.1.3"), ("x", "2.13.0")],
)
def test_other_major_minor_is_refused(built, running):
    msg = tv.mismatch_error(built, running)
    assert msg is not None
    assert f"built against torch {built}" in msg and f"torch {running} is installed" in msg
    assert "pip install --no-build-isolation -e ." in msg and tv.ALLOW_ENV in msg


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


def test_import_refuses_another_torch(tmp_path):
    r = _import_with_recorded("2.12.0+cpu", tmp_path)
    assert r.returncode == 3, r.stdout + r.stderr
    assert f"built against torch 2.12.0+cpu, but torch {torch.__version__} is installed" in r.stdout
    assert "pip install --no-build-isolation -e ." in r.stdout
    assert "EXTENSION_LOADED False" in r.stdout  # refused before the extension was loaded


def test_import_override_loads_with_a_warning(tmp_path):
    r = _import_with_recorded("2.12.0+cpu", tmp_path, allow=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "LOADED" in r.stdout
    assert "RuntimeWarning" in r.stderr and "built against torch 2.12.0+cpu" in r.stderr


def test_import_same_minor_other_patch_loads(tmp_path):
    major, minor = tv.major_minor(torch.__version__)
    r = _import_with_recorded(f"{major}.{minor}.99+other", tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "LOADED" in r.stdout
