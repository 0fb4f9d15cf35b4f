#!/usr/bin/env bash
# compare-mpi.sh — dtrain's collectives against Open MPI's, same machine,
# same run, same sizes, same rank counts; shared memory and TCP-only.
#
#   bench/compare-mpi.sh [BUILD_DIR] [OPS] [NPS] [SIZES] [REPEATS]
#   bench/compare-mpi.sh build "allreduce reduce_scatter allgather" "2 4" 8:64M 3
#   TRANSPORTS=shm bench/compare-mpi.sh ...   (only one of shm, tcp)
#   READ=1 bench/compare-mpi.sh ...           every call's output is read by its
#                                             rank inside the timing (a consumer), both sides
#
# For each (transport, np, op) it runs our `dtrain bench comm` and our
# Open MPI benchmark (bench/mpi_bench.c, built here with mpicc) REPEATS
# times, interleaved, and prints the median time and busbw of each and
# the ratio ours/theirs (busbw; > 1 means dtrain is faster). Open MPI runs
# with its defaults for shared memory (vader BTL) and with
# `--mca btl tcp,self` for TCP; dtrain with DT_TRANSPORT=shm / tcp.
# It also prints the machine's memcpy bandwidth, the ceiling for the
# shared-memory case. The machine may be shared: read ratios, not absolutes.
set -euo pipefail
BUILD=${1:-build}
OPS=${2:-"allreduce reduce_scatter allgather"}
NPS=${3:-"2 4"}
SIZES=${4:-8:64M}
REPS=${5:-3}
here=$(cd "$(dirname "$0")" && pwd)
DTRAIN=$BUILD/dtrain
[ -x "$DTRAIN" ] || { echo "no $DTRAIN: build first (make)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpicc -O2 -o "$tmp/mpi_bench" "$here/mpi_bench.c"

to_bytes() { # 64M -> bytes
    local v=$1 n=${1%[KMGkmg]}
    case ${v: -1} in K|k) echo $((n << 10));; M|m) echo $((n << 20));; G|g) echo $((n << 30));; *) echo "$v";; esac
}
lo=$(to_bytes "${SIZES%%:*}"); hi=$(to_bytes "${SIZES##*:}")
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none)

echo "# machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load $(cut -d' ' -f1-3 /proc/loadavg)"
"$DTRAIN" bench memcpy --size 64M --iters 5 | sed 's/^/# /'

for tp in ${TRANSPORTS:-shm tcp}; do
  for np in $NPS; do
    for op in $OPS; do
      for r in $(seq 1 "$REPS"); do
        "$DTRAIN" bench comm --nproc "$np" --op "$op" --sizes "$lo:$hi" --transport "$tp" \
            --warmup 3 ${READ:+--read} | grep -v '^#' | awk -v r="$r" '{print r, $1, $3, $5, $6}' >> "$tmp/ours.$tp.$np.$op"
        if [ "$tp" = tcp ]; then mca=(--mca btl tcp,self); else mca=(); fi
        "${MPIRUN[@]}" -np "$np" "${mca[@]}" -x READ="${READ:-0}" "$tmp/mpi_bench" "$op" "$lo" "$hi" 2>/dev/null \
            | grep -v '^#' | awk -v r="$r" '{print r, $1, $3, $5}' >> "$tmp/mpi.$tp.$np.$op"
      done
      echo
      echo "## $op, $np ranks, $tp (median of $REPS runs; busbw in GB/s)"
      printf "%12s %12s %12s %10s %10s %8s %8s\n" size "ours(us)" "ompi(us)" ours_bw ompi_bw ratio algo
      python3 - "$tmp/ours.$tp.$np.$op" "$tmp/mpi.$tp.$np.$op" <<'PY'
import sys, statistics as st
def load(p, cols):
    d = {}
    for line in open(p):
        f = line.split()
        d.setdefault(int(f[1]), []).append(f[2:])
    return d
ours, mpi = load(sys.argv[1], 3), load(sys.argv[2], 2)
for size in sorted(ours):
    o = ours[size]; m = mpi.get(size)
    ot = st.median(float(x[0]) for x in o); ob = st.median(float(x[1]) for x in o)
    algo = o[0][2]
    if m:
        mt = st.median(float(x[0]) for x in m); mb = st.median(float(x[1]) for x in m)
        ratio = mt / ot  # = busbw ours / busbw theirs (same bytes and factor)
        print(f"{size:12d} {ot:12.2f} {mt:12.2f} {ob:10.3f} {mb:10.3f} {ratio:8.2f} {algo:>8}")
    else:
        print(f"{size:12d} {ot:12.2f} {'-':>12} {ob:10.3f} {'-':>10} {'-':>8} {algo:>8}")
PY
    done
  done
done
