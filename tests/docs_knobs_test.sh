#!/usr/bin/env bash
# The docs match the binaries: every GW_* variable named in docs/*.md and README.md is a row of
# the configuration registry as `gradwire-perf --dump-config` prints it (or a name of the C
# header or a CMake option, which are not knobs; "GW_COST_INTER_*"-style prefixes must start a
# row's name), every row of docs/configuration.md's table is registered, and no section is a
# to-do (TODO/TBD/FIXME markers, "to be written", a heading with nothing under it).
# usage: docs_knobs_test.sh SOURCE_DIR GRADWIRE_PERF
set -uo pipefail
src="$1"; perf="$2"
errors=0
err() { echo "docs_knobs_test: $*" >&2; errors=$((errors + 1)); }

registry=$("$perf" --dump-config | awk '!/^#/ && $1 ~ /^GW_/ { print $1 }' | sort -u)
[ "$(wc -l <<<"$registry")" -gt 20 ] || { echo "docs_knobs_test: FAIL: --dump-config listed too few rows" >&2; exit 1; }
# Not knobs: the C header's names (status codes, dtypes, macros) and the build's CMake options.
not_knobs=$( { grep -ohE '\bGW_[A-Z0-9_]+' "$src"/include/gradwire/*.h
               find "$src" -path "$src/build" -prune -o \( -name CMakeLists.txt -o -name '*.cmake' \) \
                 -print0 | xargs -0 grep -ohE '\bGW_[A-Z0-9_]+'; } | sort -u)

docs=("$src"/docs/*.md "$src/README.md")
for f in "${docs[@]}"; do
  while IFS=: read -r line name; do
    grep -qxF "$name" <<<"$registry" && continue
    grep -qxF "$name" <<<"$not_knobs" && continue
    if [[ "$name" == *_ ]] && grep -q "^$name" <<<"$registry"; then continue; fi
    err "${f#"$src"/}:$line: $name is not a registered setting (gradwire-perf --dump-config)"
  done < <(grep -noE '\bGW_[A-Z0-9_]+' "$f" | awk -F: '{ print $1 ":" $2 }')
done

# docs/configuration.md's table: one row per registered setting, none of another build.
while read -r name; do
  grep -qxF "$name" <<<"$registry" || err "docs/configuration.md lists $name, which is not registered"
done < <(grep -oE '^\| [a-z_]+ \| `GW_[A-Z0-9_]+`' "$src/docs/configuration.md" | grep -oE 'GW_[A-Z0-9_]+')

# No to-do sections.
for f in "${docs[@]}"; do
  while IFS= read -r hit; do
    err "${f#"$src"/}:${hit%%:*}: a to-do marker: ${hit#*:}"
  done < <(grep -nE '\b(TODO|TBD|FIXME|XXX)\b|to be written|coming soon' "$f")
  while IFS= read -r hit; do err "$hit"; done < <(awk -v F="${f#"$src"/}" '
    /^```/ { code = !code }
    !code && /^#+ / {
      level = length($1)
      if (h != "" && !body && level <= hlevel) print F ":" hline ": empty section: " h
      h = $0; hline = NR; hlevel = level; body = 0; next
    }
    NF > 0 { body = 1 }
    END { if (h != "" && !body) print F ":" hline ": empty section: " h }' "$f")
done

if [ "$errors" -gt 0 ]; then
  echo "docs_knobs_test: FAIL ($errors finding(s))" >&2
  exit 1
fi
echo "docs_knobs_test: ok ($(wc -l <<<"$registry") registered settings)"
