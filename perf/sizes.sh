# shellcheck shell=bash
# Sourced by the perf scripts that take sizes (perf/*_peers.sh, cluster_bench.sh, ps_bench.sh).

to_bytes() {  # 64K, 4M, 1G or a plain count -> bytes; a bad size says so and exits 2
  local s="$1" n="${1%[KkMmGg]}"
  [[ "$n" =~ ^[0-9]+$ ]] || { echo "$(basename "$0" .sh): bad size '$s'" >&2; exit 2; }
  case "$s" in
    *[Kk]) echo $(( n << 10 )) ;; *[Mm]) echo $(( n << 20 )) ;; *[Gg]) echo $(( n << 30 )) ;;
    *) echo "$n" ;;
  esac
}
