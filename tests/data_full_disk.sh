#!/bin/sh
# data_full_disk.sh DTRAIN — `dtrain data prepare` onto a full disk: a 64 KiB
# tmpfs mounted in a private user+mount namespace (no root needed). The write
# must fail with "No space left on device", leave no temporary file, and keep
# the previous, complete output usable. Exits 77 (ctest: skipped) where user
# namespaces are not allowed.
set -u
DTRAIN=$1
unshare -rm true 2>/dev/null || { echo "skipped: unshare -rm is not permitted here"; exit 77; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/dt_full.XXXXXX")
trap 'rm -rf "$dir"' EXIT
i=0; while [ $i -lt 300 ]; do echo "line $i of a small corpus"; i=$((i+1)); done > "$dir/small.txt"
i=0; while [ $i -lt 4000 ]; do echo "line $i of a corpus too large for the disk"; i=$((i+1)); done > "$dir/big.txt"
mkdir "$dir/disk"
unshare -rm sh -s "$DTRAIN" "$dir" <<'INNER'
set -u
DTRAIN=$1 dir=$2
fail() { echo "FAIL: $*"; exit 1; }
mount -t tmpfs -o size=64k tmpfs "$dir/disk" || fail "cannot mount a tmpfs"
"$DTRAIN" data prepare "$dir/small.txt" -o "$dir/disk/out.tok" >/dev/null || fail "small prepare failed"
out=$("$DTRAIN" data prepare "$dir/big.txt" -o "$dir/disk/out.tok" 2>&1); rc=$?
[ $rc -ne 0 ] || fail "prepare onto a full disk succeeded"
case $out in *"No space left on device"*) ;; *) fail "message lacks the cause: $out" ;; esac
echo "ok: full disk -> exit $rc: $(echo "$out" | head -1)"
left=$(ls -A "$dir/disk" | grep -c tmp)
[ "$left" = 0 ] || fail "temporary file left: $(ls "$dir/disk")"
n=$(wc -c < "$dir/small.txt")
"$DTRAIN" data info "$dir/disk/out.tok" | grep -q "^tokens *$n\$" ||
    fail "the previous out.tok ($n tokens) is not intact"
echo "ok: previous out.tok intact, no temporary file"
INNER
