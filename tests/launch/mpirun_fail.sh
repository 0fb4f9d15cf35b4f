#!/usr/bin/env bash
# mpirun_fail.sh MPIRUN COLL_CHECK — under mpirun, with either backend, a
# rank that exits with code 3 while the others are in an allreduce ends the
# job within seconds, and the failing rank is named: by mpirun (rank 1, exit
# code 3) or, when a survivor's own exit reaches mpirun first, by the
# survivors' DT_ERR_PEER message ("rank 1 is lost").
set -uo pipefail
mpirun=$1
coll=$2
fail() { echo "FAIL: $*" >&2; exit 1; }
for backend in native mpi; do
    start=$(date +%s%N)
    out=$("$mpirun" --oversubscribe --allow-run-as-root -np 3 -x DT_BACKEND=$backend \
        -x DT_TIMEOUT=60 "$coll" --die 1 2>&1)
    rc=$?
    ms=$((($(date +%s%N) - start) / 1000000))
    echo "$out" | tail -n 8
    [[ $rc -ne 0 ]] || fail "$backend: mpirun exited 0"
    echo "$out" | grep -q "rank 1: exiting with code 3 on purpose" || fail "$backend: no message from rank 1"
    named_by_mpirun=0
    if echo "$out" | grep -Eq "Process name: \[\[[0-9]+,1\],1\]" &&
        echo "$out" | grep -Eq "Exit code: +3"; then
        named_by_mpirun=1
    fi
    if [[ $named_by_mpirun -eq 0 ]]; then
        echo "$out" | grep -q "DT_ERR_PEER.*rank 1 is lost" ||
            fail "$backend: neither mpirun nor a surviving rank named rank 1"
    fi
    ((ms < 20000)) || fail "$backend: took $ms ms"
    echo "ok: DT_BACKEND=$backend: rank 1 failing ended the mpirun job in $ms ms"
done
