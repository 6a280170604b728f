"""libFuzzer target (atheris) for the GGUF loader: any bytes either load or raise one
CheckpointError line; nothing else escapes (no IndexError, struct.error, numpy warning turned
error, huge allocation or hang). Started from a tiny valid GGUF (the seed corpus), mutated with
coverage feedback from the parser and the validation in mtp_kernels/models/checkpoint.py.

    make fuzz                                            # with the other fuzz targets
    .venv/bin/python python_tests/fuzz_gguf.py -max_total_time=600 build/fuzz-gguf-corpus

CI runs it for 20 s from a fixed seed (test_hostile_loaders.py::test_fuzz_gguf_briefly), beside
the seeded byte flips there.
"""

import inspect
import os
import pathlib
import sys
import tempfile
import warnings

import atheris

# Imported first, so that only the loader's own modules get coverage probes.
import gguf  # noqa: F401,E402
import jinja2.sandbox  # noqa: F401,E402
import numpy  # noqa: F401,E402
import safetensors.torch  # noqa: F401,E402
import tokenizers  # noqa: F401,E402
import torch  # noqa: F401,E402

import mtp_kernels  # noqa: F401,E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from mtp_kernels.models import checkpoint, config  # noqa: E402
from mtp_kernels.models.checkpoint import CheckpointError  # noqa: E402


def instrument(module) -> None:
    """Coverage probes in every function and method the module defines (the package's editable
    install imports through its own finder, which atheris.instrument_imports does not reach)."""
    for name, obj in list(vars(module).items()):
        if getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj):
            setattr(module, name, atheris.instrument_func(obj))
        elif inspect.isclass(obj):
            for attr, fn in list(vars(obj).items()):
                if inspect.isfunction(fn):
                    setattr(obj, attr, atheris.instrument_func(fn))


instrument(checkpoint)
instrument(config)

WORK = tempfile.mkdtemp(prefix="fuzz-gguf-")
TARGET = os.path.join(WORK, "f.gguf")


def seed_corpus(corpus: str) -> None:
    """The tiny GGUF of the loader tests, as the corpus's first entry."""
    from test_hostile_loaders import tiny_gguf

    os.makedirs(corpus, exist_ok=True)
    if not os.listdir(corpus):
        tiny_gguf(os.path.join(corpus, "tiny.gguf"))


def test_one_input(data: bytes) -> None:
    with open(TARGET, "wb") as f:
        f.write(data)
    for native in (False, True):
        try:
            checkpoint.load(TARGET, native=native)
        except CheckpointError as e:
            if "\n" in str(e):
                raise AssertionError(f"a loader error of more than one line: {e!r}") from e


def main() -> None:
    warnings.simplefilter("error")  # a numpy warning on odd bytes is a finding too
    corpus = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
    if corpus:
        seed_corpus(corpus)
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
