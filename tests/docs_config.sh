#!/bin/sh
# docs_config.sh DTRAIN SRC — docs/config.md is the one table of knobs: every
# long option of every command and action outside `bench` (whose options
# are a benchmark's, not knobs) is in it, and every flag in the first column
# of its tables is one that some `dtrain help ...` still lists (a renamed
# flag such as --peak-gflops -> --peak-flops leaves no stale row).
set -u
DTRAIN=$1 SRC=$2
DOC=$SRC/docs/config.md
dir=$(mktemp -d "${TMPDIR:-/tmp}/dt_docs.XXXXXX")
trap 'rm -rf "$dir"' EXIT
cd "$dir" || exit 1
# options CMD...: the long options `dtrain help CMD...` lists.
options() { "$DTRAIN" help "$@" 2> /dev/null | sed -n 's/^  \(-., \)\{0,1\} *--\([a-z0-9-]*\).*/\2/p' | grep -v '^help$'; }
# actions CMD...: the actions `dtrain help CMD...` lists.
actions() { "$DTRAIN" help "$@" 2> /dev/null | sed -n '/^\(actions\|benchmarks\|plans\):/,/^$/s/^  \([a-z0-9-]*\)  .*/\1/p'; }
: > knobs
: > all
for c in $("$DTRAIN" --help | sed -n 's/^  \([a-z]*\) .*/\1/p' | grep -v '^help$'); do
    for a in "" $(actions "$c"); do
        for b in "" $( [ -n "$a" ] && actions "$c" "$a"); do
            # shellcheck disable=SC2086
            options $c $a $b | sed "s|^|$c${a:+ $a}${b:+ $b} |" >> all
        done
    done
done
grep -v '^bench ' all > knobs
[ "$(wc -l < knobs)" -ge 80 ] || { echo "FAIL: only $(wc -l < knobs) options found"; exit 1; }
bad=0
while read -r line; do
    opt=${line##* }
    grep -q -- "--$opt\`" "$DOC" || { echo "FAIL: docs/config.md lacks --$opt ($line)"; bad=1; }
done < knobs
awk '{print $NF}' all | sort -u > names
for opt in $(sed -n 's/^| \([^|]*\)|.*/\1/p' "$DOC" | grep -o -- '--[a-z][a-z0-9-]*' | sed 's/^--//' | sort -u); do
    grep -qx -- "$opt" names || { echo "FAIL: docs/config.md lists --$opt, which no command has"; bad=1; }
done
[ $bad = 0 ] || exit 1
echo "all passed: $(wc -l < knobs) options of $(awk '{$NF=""; print}' knobs | sort -u | wc -l) commands documented"
