# bench/train_lib.sh — sourced by the training benchmarks (tp.sh,
# pipeline.sh, zero.sh) after they set $dtrain: the text
# (../shared/data/tinyshakespeare.txt when present, else README.md), a
# scratch directory $work removed on exit, one `dtrain train` run, and the
# median of a list.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
data=$here/../shared/data/tinyshakespeare.txt
[[ -f $data ]] || data=$here/README.md
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# train_run NAME ARGS...: `dtrain train ARGS` with the benchmarks' common
# settings (1 thread per rank, no sample, no validation split), run folder
# $work/NAME, log $work/NAME.log; a failure ends the benchmark with the
# log's tail.
train_run() {
    local name=$1
    shift
    rm -rf "${work:?}/$name"
    "$dtrain" train --data "$data" --threads 1 --peak-flops 1e9 --sample-tokens 0 \
        --progress plain --val-split 0 --run-dir "$work/$name" "$@" >"$work/$name.log" 2>&1 || {
        echo "$(basename "$0"): dtrain train $* failed:" >&2
        tail -n 5 "$work/$name.log" >&2
        exit 1
    }
}

# med "V1 V2 ...": the median.
med() { printf '%s\n' $1 | sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
