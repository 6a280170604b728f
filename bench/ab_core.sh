#!/usr/bin/env bash
# A/B of a torch-free kernel between two commits on this noisy machine: builds bench/core_NAME.cpp
# against each commit's csrc/include (a revision "." is the working tree), then runs the two
# binaries in turn ROUNDS times (default 6) with ARGS, each output line prefixed "a " or "b ".
#   bench/ab_core.sh A_REV B_REV NAME [ARGS...]      (e.g. NAME attention: core_attention.cpp)
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 A_REV B_REV NAME [ARGS...]" >&2; exit 2; }
a_rev=$1 b_rev=$2 name=$3; shift 3
root=$(git rev-parse --show-toplevel)
[ -f "$root/bench/core_$name.cpp" ] || { echo "$0: no bench/core_$name.cpp" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for side in a b; do
  rev=$([ $side = a ] && echo "$a_rev" || echo "$b_rev")
  mkdir -p "$work/$side"
  if [ "$rev" = . ]; then mkdir -p "$work/$side/csrc" && cp -r "$root/csrc/include" "$work/$side/csrc/"
  else git -C "$root" archive "$rev" csrc/include | tar -x -C "$work/$side"; fi
  g++ -O3 -std=c++17 -ffp-contract=off -fno-trapping-math -w -Wno-psabi -pthread -I"$work/$side/csrc/include" \
    "$root/bench/core_$name.cpp" -o "$work/$side/core_$name"
done
for _ in $(seq "${ROUNDS:-6}"); do
  "$work/a/core_$name" "$@" | sed 's/^/a /'
  "$work/b/core_$name" "$@" | sed 's/^/b /'
done
