"""Which torch the compiled extension was built against, checked before it is loaded.

``mtp_kernels._C`` is built against torch's C++ API (TORCH_LIBRARY, ATen), whose ABI torch
does not keep across releases: a build is made for one torch major.minor. The build writes
the torch it used to ``_build_info.py`` (CMakeLists.txt); importing the package under
another major.minor raises an ImportError that names both and says how to rebuild, instead
of an undefined-symbol error or, worse, a load that succeeds with a changed tensor layout.
The env var ``MTP_KERNELS_ALLOW_TORCH_MISMATCH=1`` loads it anyway (with a warning).
See docs/torch-versions.md.
"""

from __future__ import annotations

import importlib
import os
import re
import warnings

import torch

ALLOW_ENV = "MTP_KERNELS_ALLOW_TORCH_MISMATCH"

REBUILD = (
    "Rebuild it against the installed torch (a build serves one torch major.minor): from a "
    "source checkout, `pip install --no-build-isolation -e .` (or `pip wheel --no-build-isolation "
    "--no-deps .` for a wheel), or install the torch it was built for. "
    f"To load it anyway (untested combinations may crash), set {ALLOW_ENV}=1. See docs/torch-versions.md."
)


def major_minor(version: str) -> tuple[int, int] | None:
    """(major, minor) of a torch version string such as '2.13.0+cpu' or '2.14.0.dev20261001'."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def mismatch_error(built: str | None, running: str) -> str | None:
    """The ImportError message for an extension built against torch `built` loaded under
    torch `running`, or None when they agree (same major.minor; patch releases and the local
    tag, +cpu / +cu130, may differ) or the build recorded nothing (a tree built before the
    record existed)."""
    if not built:
        return None
    b, r = major_minor(built), major_minor(running)
    if b is not None and b == r:
        return None
    return f"mtp_kernels was built against torch {built}, but torch {running} is installed. {REBUILD}"


def built_torch_version() -> str | None:
    """The torch version the installed extension was built against (None when unrecorded)."""
    try:
        from . import _build_info
    except ImportError:
        return None
    return getattr(_build_info, "TORCH_VERSION", None)


def load_extension():
    """Checks the torch version, then imports and returns ``mtp_kernels._C``."""
    built = built_torch_version()
    msg = mismatch_error(built, torch.__version__)
    if msg is not None:
        if os.environ.get(ALLOW_ENV) != "1":
            raise ImportError(msg)
        warnings.warn(f"{msg} Loading it anyway ({ALLOW_ENV}=1).", RuntimeWarning, stacklevel=3)
    try:
        return importlib.import_module(f"{__package__}._C")
    except ImportError as e:
        # e.g. an undefined symbol of a torch this build does not match (or an unrecorded one)
        raise ImportError(
            f"mtp_kernels could not load its compiled extension under torch {torch.__version__} "
            f"(built against torch {built or 'an unrecorded version'}): {e}. {REBUILD}"
        ) from e


# Imported by the package's __init__ before anything else of it.
_C = load_extension()
