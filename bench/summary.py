"""The main job until the generation runtime exists: a short verify benchmark against the
torch implementation, with the memory bandwidth measured in the same run, as a table.

    python bench/summary.py [pytest -k expression]
"""
import os
import sys
import tempfile

import pytest

import report

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CASES = "bandwidth or 1-4-49152 or 8-4-49152 or 64-8-128256"


def main(argv):
    selection = argv[1] if len(argv) > 1 else DEFAULT_CASES
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.json")
        code = pytest.main([os.path.join(HERE, "bench_bandwidth.py"), os.path.join(HERE, "bench_verify.py"),
                            "-q", "-k", selection, "--benchmark-only", f"--benchmark-json={out}", "-p", "no:cacheprovider"])
        if code != 0:
            return int(code)
        data, groups = report.load(out)
        print("\n" + report.table(groups))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
