#!/usr/bin/env bash
# A/B of whole backbone passes between two builds of the extension on this noisy machine:
# installs each build's _C in turn (ROUNDS times, alternating) and runs bench/pass_times.py
# with the given arguments; the installed build is put back at the end. A build is a copy of
# .venv/lib/python3.11/site-packages/mtp_kernels/_C*.so made after `make build` at a commit.
#   bench/ab_builds.sh A.so B.so T [T ...]      (ROUNDS=4 by default)
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 A.so B.so T [T ...]" >&2; exit 2; }
a=$1 b=$2; shift 2
root=$(git rev-parse --show-toplevel)
installed=$(ls "$root"/.venv/lib/python3.*/site-packages/mtp_kernels/_C*.so)
saved=$(mktemp)
cp "$installed" "$saved"
trap 'cp "$saved" "$installed"; rm -f "$saved"' EXIT
for _ in $(seq "${ROUNDS:-4}"); do
  for side in A B; do
    cp "$([ $side = A ] && echo "$a" || echo "$b")" "$installed"
    echo "$side: $("$root/.venv/bin/python" "$root/bench/pass_times.py" "$@" 2>/dev/null)"
  done
done
