# Shell functions the bench scripts share; source it from the repository root (`. bench/lib.sh`).

# median V1 V2 ...: the median of the numbers given (the mean of the middle two for an even
# count).
median() {
  printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'
}
