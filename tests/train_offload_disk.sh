#!/bin/sh
# train_offload_disk.sh DTRAIN CORPUS — the optimizer state and ZeRO 3's
# parameter pieces offloaded to disk (--offload optimizer=disk:DIR,
# params=disk:DIR), where things go wrong:
#   1. DIR on a full disk (a 1 MiB tmpfs in a private user+mount namespace):
#      training fails at once with "No space left on device" and the
#      directory's name, and leaves no file behind (the optimizer's file, and
#      the parameters' under zero 3);
#   2. a rank killed (SIGKILL) while it streams its state through the file,
#      and while its parameter pieces are written back (every step): every
#      rank exits, no offload file is left, and the last checkpoint resumes.
# Exits 77 (ctest: skipped) where user namespaces are not allowed.
set -u
DTRAIN=$1 CORPUS=$2
fail() { echo "FAIL: $*"; exit 1; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/dt_offload.XXXXXX")
trap 'rm -rf "$dir"' EXIT
MODEL="--data $CORPUS --model tiny --layers 4 --dim 128 --heads 4 --seq 32 --threads 1
       --global-batch 8 --sample-tokens 0 --progress plain --val-split 0 --lr 1e-3"

# 2. kill a rank mid-run: the state lives in an unlinked file, the
# checkpoints elsewhere.
mkdir "$dir/off"
kill_and_resume() { # NAME ZERO OFFLOAD
    "$DTRAIN" train $MODEL --nproc 2 --zero $2 --steps 100000 --ckpt-every 5 \
        --ckpt-dir "$dir/ck$1" --run-dir "$dir/run$1" --offload "$3" \
        >"$dir/run$1.log" 2>&1 &
    pid=$!
    i=0
    while [ ! -e "$dir/ck$1/latest" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
    [ -e "$dir/ck$1/latest" ] || fail "$1: no checkpoint after 60 s: $(tail -n 3 "$dir/run$1.log")"
    sleep 0.5
    rank=$(pgrep -P $pid | head -n 1)
    [ -n "$rank" ] || fail "$1: no rank process under $pid"
    kill -KILL "$rank"
    i=0
    while kill -0 $pid 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
    if kill -0 $pid 2>/dev/null; then
        kill -KILL $pid
        fail "$1: the job did not exit within 30 s of a killed rank"
    fi
    wait $pid && fail "$1: the job exited 0 after a rank was killed"
    echo "ok: $1: killed rank $rank; the job exited in $((i / 10)) s: $(grep -m1 -E 'signal|killed|exited with' "$dir/run$1.log" | head -c 200)"
    [ -z "$(ls -A "$dir/off")" ] || fail "$1: offload files left: $(ls "$dir/off")"
    out=$("$DTRAIN" train $MODEL --nproc 2 --zero $2 --steps 100000 --stop-after 2 --resume \
        --ckpt-dir "$dir/ck$1" --run-dir "$dir/run$1" --offload "$3" 2>&1) ||
        fail "$1: resume failed: $(echo "$out" | tail -n 3)"
    case $out in *"resumed from"*) ;; *) fail "$1: did not resume: $(echo "$out" | tail -n 3)" ;; esac
    echo "ok: $1: the last checkpoint resumed, no file left in the offload directory"
}
kill_and_resume optimizer 1 optimizer=disk:"$dir/off"
kill_and_resume params 3 params=disk:"$dir/off",optimizer=disk:"$dir/off"

# 1. a full disk.
unshare -rm true 2>/dev/null || { echo "skipped: unshare -rm is not permitted here"; exit 77; }
mkdir "$dir/disk"
unshare -rm sh -s "$DTRAIN" "$dir" "$MODEL" <<'INNER'
set -u
DTRAIN=$1 dir=$2 MODEL=$3
fail() { echo "FAIL: $*"; exit 1; }
mount -t tmpfs -o size=1m tmpfs "$dir/disk" || fail "cannot mount a tmpfs"
out=$("$DTRAIN" train $MODEL --steps 2 --ckpt-dir "$dir/ck2" --run-dir "$dir/run2" \
    --offload optimizer=disk:"$dir/disk" 2>&1); rc=$?
[ $rc -ne 0 ] || fail "training with its optimizer state on a full disk succeeded"
case $out in *"No space left on device"*) ;; *) fail "message lacks the cause: $out" ;; esac
case $out in *"$dir/disk"*) ;; *) fail "message lacks the directory: $out" ;; esac
[ -z "$(ls -A "$dir/disk")" ] || fail "file left on the full disk: $(ls "$dir/disk")"
echo "ok: full disk -> exit $rc: $(echo "$out" | grep -m1 'No space')"
# ZeRO 3's parameter pieces (the optimizer state in memory).
out=$("$DTRAIN" train $MODEL --steps 2 --nproc 2 --zero 3 --ckpt-dir "$dir/ck3" \
    --run-dir "$dir/run3" --offload params=disk:"$dir/disk" 2>&1); rc=$?
[ $rc -ne 0 ] || fail "training with its parameters on a full disk succeeded"
case $out in *"No space left on device"*) ;; *) fail "params: message lacks the cause: $out" ;; esac
case $out in *"parameter offload"*"$dir/disk"*) ;; *) fail "params: message lacks the directory: $out" ;; esac
[ -z "$(ls -A "$dir/disk")" ] || fail "params: file left on the full disk: $(ls "$dir/disk")"
echo "ok: parameters on a full disk -> exit $rc: $(echo "$out" | grep -m1 'No space')"
INNER
