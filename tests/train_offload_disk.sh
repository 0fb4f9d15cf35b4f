#!/bin/sh
# train_offload_disk.sh DTRAIN CORPUS — the optimizer state offloaded to disk
# (--offload optimizer=disk:DIR), where things go wrong:
#   1. DIR on a full disk (a 1 MiB tmpfs in a private user+mount namespace):
#      training fails at once with "No space left on device" and the
#      directory's name, and leaves no file behind;
#   2. a rank killed (SIGKILL) while it streams its state through the file:
#      every rank exits, no offload file is left, and the last checkpoint
#      resumes.
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
"$DTRAIN" train $MODEL --nproc 2 --zero 1 --steps 100000 --ckpt-every 5 \
    --ckpt-dir "$dir/ck" --run-dir "$dir/run" --offload optimizer=disk:"$dir/off" \
    >"$dir/run.log" 2>&1 &
pid=$!
i=0
while [ ! -e "$dir/ck/latest" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
[ -e "$dir/ck/latest" ] || fail "no checkpoint after 60 s: $(tail -n 3 "$dir/run.log")"
sleep 0.5
rank=$(pgrep -P $pid | head -n 1)
[ -n "$rank" ] || fail "no rank process under $pid"
kill -KILL "$rank"
i=0
while kill -0 $pid 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
if kill -0 $pid 2>/dev/null; then
    kill -KILL $pid
    fail "the job did not exit within 30 s of a killed rank"
fi
wait $pid && fail "the job exited 0 after a rank was killed"
echo "ok: killed rank $rank; the job exited in $((i / 10)) s: $(grep -m1 -E 'signal|killed|exited with' "$dir/run.log" | head -c 200)"
[ -z "$(ls -A "$dir/off")" ] || fail "offload files left: $(ls "$dir/off")"
out=$("$DTRAIN" train $MODEL --nproc 2 --zero 1 --steps 100000 --stop-after 2 --resume --ckpt-dir "$dir/ck" --run-dir "$dir/run" \
    --offload optimizer=disk:"$dir/off" 2>&1) || fail "resume failed: $(echo "$out" | tail -n 3)"
case $out in *"resumed from"*) ;; *) fail "did not resume: $(echo "$out" | tail -n 3)" ;; esac
echo "ok: the last checkpoint resumed, no file left in the offload directory"

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
INNER
