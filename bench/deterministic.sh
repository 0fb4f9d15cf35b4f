#!/usr/bin/env bash
# deterministic.sh [DTRAIN] [RUNS] — the cost of DT_DETERMINISTIC=1: allreduce
# time with the mode against the fastest algorithm without it, on 2 and 4
# ranks of this machine, shared memory (the default) and TCP, 1-16 MiB f32.
# Each configuration runs RUNS times (default 3) interleaved; the table shows
# medians and the ratio deterministic / fastest (lower is better; 1.00 means
# free). Run it alone on the machine: `flock -x /tmp/dtrain-cpu.lock`.
set -euo pipefail
dtrain=${1:-build/dtrain}
runs=${2:-3}
sizes=1M:16M
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# one run: "size time_us" lines for bench comm with the given extra flags
one() {
    local np=$1 tp=$2 out=$3
    shift 3
    "$dtrain" bench comm --nproc "$np" --transport "$tp" --sizes $sizes --warmup 2 "$@" |
        awk '$1 ~ /^[0-9]+$/ {print $1, $3, $6}' >>"$out"
}

for np in 2 4; do
    for tp in shm tcp; do
        algos=(auto ring rhd)
        [[ $tp == shm ]] && algos=(auto direct ring)
        for ((r = 0; r < runs; r++)); do
            for a in "${algos[@]}"; do one $np $tp "$tmp/$np.$tp.$a" --algo "$a"; done
            one $np $tp "$tmp/$np.$tp.det" --deterministic
        done
        echo "# $np ranks, transport $tp: median us of $runs runs (algorithm that ran)"
        printf '%10s' size
        for a in "${algos[@]}"; do printf '%18s' "$a"; done
        printf '%18s %10s\n' deterministic det/best
        for size in $(awk '{print $1}' "$tmp/$np.$tp.det" | sort -n -u); do
            printf '%10s' "$size"
            best=""
            for a in "${algos[@]}" det; do
                med=$(awk -v s="$size" '$1 == s {print $2}' "$tmp/$np.$tp.$a" | sort -g |
                    awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')
                ran=$(awk -v s="$size" '$1 == s {print $3}' "$tmp/$np.$tp.$a" | head -n1)
                printf '%18s' "$med ($ran)"
                if [[ $a != det ]] && { [[ -z $best ]] || awk -v m="$med" -v b="$best" 'BEGIN {exit !(m < b)}'; }; then
                    best=$med
                fi
                [[ $a == det ]] && det=$med
            done
            awk -v d="$det" -v b="$best" 'BEGIN {printf " %10.2f\n", d / b}'
        done
    done
done
