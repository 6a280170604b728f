#!/usr/bin/env bash
# A/B of the linear kernel between two commits on this noisy machine: builds bench/core_linear.cpp
# against each commit's csrc/include, runs the two binaries in turn ROUNDS times and prints, per
# M, the best time of each and their ratio (B / A; below 1: B is faster). A revision "." is the
# working tree.
#   bench/ab_linear.sh A_REV B_REV bf16|int8|int8dot N K reps [copies]     (ROUNDS=6 by default)
set -euo pipefail
[ $# -ge 6 ] || { echo "usage: $0 A_REV B_REV bf16|int8|int8dot N K reps [copies]" >&2; exit 2; }
a_rev=$1 b_rev=$2; shift 2
root=$(git rev-parse --show-toplevel)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for side in a b; do
  rev=$([ $side = a ] && echo "$a_rev" || echo "$b_rev")
  mkdir -p "$work/$side"
  if [ "$rev" = . ]; then mkdir -p "$work/$side/csrc" && cp -r "$root/csrc/include" "$work/$side/csrc/"
  else git -C "$root" archive "$rev" csrc/include | tar -x -C "$work/$side"; fi
  g++ -O3 -std=c++17 -ffp-contract=off -fno-trapping-math -w -I"$work/$side/csrc/include" \
    "$root/bench/core_linear.cpp" -o "$work/$side/core_linear"
done
for _ in $(seq "${ROUNDS:-6}"); do
  "$work/a/core_linear" "$@" | sed 's/^/a /'
  "$work/b/core_linear" "$@" | sed 's/^/b /'
done | awk '{k = $2; if (!(($1, k) in t) || $3 < t[$1, k]) t[$1, k] = $3; ks[k] = 1}
  END {printf "| M | %s (us) | %s (us) | B / A |\n|---|---:|---:|---:|\n", "A", "B";
       for (m = 1; m <= 9; m++) { k = "M=" m; if (k in ks) printf "| %d | %.1f | %.1f | %.2f |\n", m, t["a", k], t["b", k], t["b", k] / t["a", k] }}'
