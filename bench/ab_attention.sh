#!/usr/bin/env bash
# A/B of the decode attention between two commits on this noisy machine: builds
# bench/core_attention.cpp against each commit's csrc/include (a revision "." is the working
# tree) and runs the two binaries in turn ROUNDS times (default 4) per n, printing every line.
#   bench/ab_attention.sh A_REV B_REV T threads passes n...
set -euo pipefail
[ $# -ge 6 ] || { echo "usage: $0 A_REV B_REV T threads passes n..." >&2; exit 2; }
a_rev=$1 b_rev=$2 T=$3 threads=$4 passes=$5; shift 5
root=$(git rev-parse --show-toplevel)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for side in a b; do
  rev=$([ $side = a ] && echo "$a_rev" || echo "$b_rev")
  mkdir -p "$work/$side"
  if [ "$rev" = . ]; then mkdir -p "$work/$side/csrc" && cp -r "$root/csrc/include" "$work/$side/csrc/"
  else git -C "$root" archive "$rev" csrc/include | tar -x -C "$work/$side"; fi
  g++ -O3 -std=c++17 -ffp-contract=off -fno-trapping-math -w -pthread -I"$work/$side/csrc/include" \
    "$root/bench/core_attention.cpp" -o "$work/$side/core_attention"
done
for n in "$@"; do
  for _ in $(seq "${ROUNDS:-4}"); do
    echo "A $("$work/a/core_attention" "$n" "$T" "$threads" "$passes")"
    echo "B $("$work/b/core_attention" "$n" "$T" "$threads" "$passes")"
  done
done
