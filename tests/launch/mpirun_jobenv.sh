#!/usr/bin/env bash
# mpirun_jobenv.sh MPIRUN PROGRAM — under a real `mpirun -np 3`, every rank
# finds launcher "Open MPI", its own rank, size 3, local rank/size, and the
# same job id and (derived) token as the others.
set -euo pipefail
mpirun=$1
prog=$2
out=$("$mpirun" --oversubscribe --allow-run-as-root -np 3 "$prog")
echo "$out"
fail() { echo "FAIL: $*" >&2; exit 1; }
[[ $(echo "$out" | grep -c "^launcher=Open MPI ") == 3 ]] || fail "not 3 ranks reporting Open MPI"
for r in 0 1 2; do
    echo "$out" | grep -q "rank=$r size=3 local=$r/3 " || fail "rank $r: wrong rank/size/local"
done
[[ $(echo "$out" | sed 's/.* job=//' | sort -u | wc -l) == 1 ]] || fail "job id or token differ"
echo "$out" | grep -q "job=ompi-.* token=[0-9a-f]\{32\} derived=1" || fail "no job id / token"
echo "ok"
