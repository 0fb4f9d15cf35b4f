#!/usr/bin/env bash
# bench/launch.sh [DTRAIN] [N] [RUNS] — what starting and stopping a job
# costs with `dtrain launch`, next to Open MPI's mpirun on the same machine
# in the same run (medians of RUNS runs, wall-clock milliseconds):
#
#   start+exit  N ranks of /bin/true, launcher start to launcher exit
#   fail-stop   rank 0 exits 3 at once, the other N-1 sleep 60 s: how long
#               until the launcher has stopped them all and exited
#   relay       N ranks each print 20000 lines (tagged with [rank] for
#               dtrain, --tag-output for mpirun), output to /dev/null
set -euo pipefail
dtrain=${1:-build/dtrain}
n=${2:-8}
runs=${3:-5}
mpirun=$(command -v mpirun || true)

ms() { # median wall time of "$@" over $runs runs, in ms
    local t=() i s e
    for ((i = 0; i < runs; i++)); do
        s=$(date +%s%N)
        "$@" >/dev/null 2>&1 || true
        e=$(date +%s%N)
        t+=($(((e - s) / 1000000)))
    done
    printf '%s\n' "${t[@]}" | sort -n | sed -n "$(((runs + 1) / 2))p"
}

fail_script='if [ "${DT_RANK:-$OMPI_COMM_WORLD_RANK}" = 0 ]; then exit 3; fi; exec sleep 60'
relay_script='seq 1 20000 | sed "s/^/line /"'
mpi=(--oversubscribe --allow-run-as-root -np "$n")

printf '%-12s %8s %14s %14s %8s\n' "what" "ranks" "dtrain (ms)" "mpirun (ms)" "ratio"
row() {
    local name=$1 d m
    d=$(ms "$dtrain" launch -n "$n" "${@:3:$2}")
    if [[ -n $mpirun ]]; then
        m=$(ms "$mpirun" "${mpi[@]}" "${@:$((3 + $2))}")
        printf '%-12s %8d %14d %14d %8.2f\n' "$name" "$n" "$d" "$m" "$(echo "$d / $m" | bc -l)"
    else
        printf '%-12s %8d %14d %14s %8s\n' "$name" "$n" "$d" "-" "-"
    fi
}
row start+exit 1 /bin/true /bin/true
row fail-stop 3 sh -c "$fail_script" sh -c "$fail_script"
row relay 4 --tag-output sh -c "$relay_script" --tag-output sh -c "$relay_script"
