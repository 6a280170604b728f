#!/usr/bin/env bash
# A/B of the C API's per-call cost (bench/capi_calls.c) between two commits: builds each
# commit's libmtp_core (Release) in a worktree under build/ab-capi-<commit>, links capi_calls
# against both, and alternates them ROUNDS times (default 5) on this noisy machine.
#   bench/ab_capi.sh A_COMMIT B_COMMIT
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 A_COMMIT B_COMMIT" >&2; exit 2; }
root=$(git rev-parse --show-toplevel)
cmake=$(command -v cmake || echo "$root/.venv/bin/cmake")
for side in "$1" "$2"; do
  c=$(git -C "$root" rev-parse --short "$side")
  dir=$root/build/ab-capi-$c
  [ -d "$dir/src" ] || git -C "$root" worktree add --detach "$dir/src" "$c" >/dev/null
  "$cmake" -S "$dir/src" -B "$dir/build" -DMTP_CORE_ONLY=ON -DCMAKE_BUILD_TYPE=Release -G Ninja >/dev/null
  "$cmake" --build "$dir/build" --target mtp_core_static -j "${JOBS:-2}" >/dev/null
  cc -O2 -I"$dir/src/csrc/include" "$root/bench/capi_calls.c" "$dir/build/csrc/core/libmtp_core.a" \
    -lstdc++ -lpthread -lm -o "$dir/capi_calls"
done
a=$root/build/ab-capi-$(git -C "$root" rev-parse --short "$1")/capi_calls
b=$root/build/ab-capi-$(git -C "$root" rev-parse --short "$2")/capi_calls
for _ in $(seq "${ROUNDS:-5}"); do
  echo "A $1: $("$a" | tr '\n' ' ')"
  echo "B $2: $("$b" | tr '\n' ' ')"
done
