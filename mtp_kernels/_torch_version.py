"""Which torch the compiled extension was built against, checked before it is loaded.

``mtp_kernels._C`` uses only torch's stable C ABI (STABLE_TORCH_LIBRARY, the C shim
functions), which torch keeps loadable in later releases: a build serves the torch it was
built against and every later one, not an older one (whose shim may lack a function it
calls). The build writes the torch it used to ``_build_info.py`` (CMakeLists.txt); importing
the package under an older torch raises an ImportError that names both and says what to do,
instead of an undefined-symbol error. The env var ``MTP_KERNELS_ALLOW_TORCH_MISMATCH=1`` loads
it anyway (with a warning). See docs/torch-versions.md.
"""

from __future__ import annotations

import importlib
import os
import re
import warnings

import torch

ALLOW_ENV = "MTP_KERNELS_ALLOW_TORCH_MISMATCH"

REBUILD = (
    "Install that torch or a later one, or rebuild it against the installed torch (a build serves "
    "the torch it was built against and later releases): from a source checkout, "
    "`pip install --no-build-isolation -e .` (or `pip wheel --no-build-isolation --no-deps .` for a wheel). "
    f"To load it anyway (untested combinations may crash), set {ALLOW_ENV}=1. See docs/torch-versions.md."
)


def major_minor(version: str) -> tuple[int, int] | None:
    """(major, minor) of a torch version string such as '2.13.0+cpu' or '2.14.0.dev20261001'."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def mismatch_error(built: str | None, running: str) -> str | None:
    """The ImportError message for an extension built against torch `built` loaded under
    torch `running`, or None when it loads: `running` is the same major.minor or a later one
    (patch releases and the local tag, +cpu / +cu130, do not matter), or the build recorded
    nothing (a tree built before the record existed)."""
    if not built:
        return None
    b, r = major_minor(built), major_minor(running)
    if b is not None and r is not None and r >= b:
        return None
    need = f"torch >= {b[0]}.{b[1]}" if b is not None else "the torch it was built against"
    return f"mtp_kernels was built against torch {built}, but torch {running} is installed; it needs {need}. {REBUILD}"


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
        # e.g. an undefined symbol of a torch older than the build's (or an unrecorded one)
        raise ImportError(
            f"mtp_kernels could not load its compiled extension under torch {torch.__version__} "
            f"(built against torch {built or 'an unrecorded version'}): {e}. {REBUILD}"
        ) from e


# Imported by the package's __init__ before anything else of it.
_C = load_extension()
