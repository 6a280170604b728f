#!/usr/bin/env bash
# A/B of the linear kernel between two commits on this noisy machine: bench/ab_core.sh with
# bench/core_linear.cpp (ROUNDS rounds), then per M the best time of each and their ratio
# (B / A; below 1: B is faster). A revision "." is the working tree.
#   bench/ab_linear.sh A_REV B_REV bf16|int8|int8dot N K reps [copies]     (ROUNDS=6 by default)
set -euo pipefail
[ $# -ge 6 ] || { echo "usage: $0 A_REV B_REV bf16|int8|int8dot N K reps [copies]" >&2; exit 2; }
"$(dirname "$0")/ab_core.sh" "$1" "$2" linear "${@:3}" | awk '{k = $2; if (!(($1, k) in t) || $3 < t[$1, k]) t[$1, k] = $3; ks[k] = 1}
  END {printf "| M | %s (us) | %s (us) | B / A |\n|---|---:|---:|---:|\n", "A", "B";
       for (m = 1; m <= 9; m++) { k = "M=" m; if (k in ks) printf "| %d | %.1f | %.1f | %.2f |\n", m, t["a", k], t["b", k], t["b", k] / t["a", k] }}'
