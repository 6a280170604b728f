"""The backend matrix in the docs is the one generated from the code (tools/backend_table.py),
and what that generator reads from the sources agrees with what the dispatcher registered."""

import importlib.util
import pathlib

import torch

import mtp_kernels  # noqa: F401  (registers the ops)

ROOT = pathlib.Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("backend_table", ROOT / "tools" / "backend_table.py")
backend_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(backend_table)


def test_docs_show_the_generated_table():
    assert backend_table.main(["--check"]) == 0, "run: python tools/backend_table.py --write"


def test_schemas_are_the_registered_ops():
    registered = {n.split("::", 1)[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("mtp::")}
    assert set(backend_table.schema_ops()) == registered


def test_cpu_column_matches_the_dispatcher():
    cpu = backend_table.cpp_impls("CPU")
    for op in backend_table.schema_ops():
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"mtp::{op}", "CPU") == (op in cpu), op


def test_fallbacks_are_registered_for_cuda():
    _, fallback = backend_table.python_kernels()
    assert fallback, "no torch fallbacks found"
    for op in fallback:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"mtp::{op}", "CUDA"), op


def test_c_api_names_are_assigned_to_the_longest_op():
    capi = backend_table.c_api(["verify", "verify_ragged", "verify_sampled", "verify_sampled_ragged", "linear"])
    assert capi["verify"] == ["mtp_verify"]
    assert capi["verify_ragged"] == ["mtp_verify_ragged"]
    assert capi["verify_sampled"] == ["mtp_verify_sampled", "mtp_verify_sampled_filtered"]
    assert capi["verify_sampled_ragged"] == ["mtp_verify_sampled_ragged"]
    assert "mtp_linear_q8dot" in capi["linear"]


def test_splice_replaces_only_between_markers():
    text = f"a\n{backend_table.BEGIN}\nold\n{backend_table.END}\nb\n"
    assert backend_table.splice(text, "new") == f"a\n{backend_table.BEGIN}\nnew\n{backend_table.END}\nb\n"
    assert backend_table.splice("no markers", "new") is None
