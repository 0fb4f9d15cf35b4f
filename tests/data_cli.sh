#!/bin/sh
# data_cli.sh DTRAIN — `dtrain data prepare` and `dtrain data info` end to end:
# exit codes and messages for good, corrupt, missing and empty input.
set -u
DTRAIN=$1
dir=$(mktemp -d "${TMPDIR:-/tmp}/dt_data_cli.XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# expect CODE PATTERN CMD...: run CMD, check its exit code and that its
# output (stdout+stderr) contains PATTERN.
expect() {
    code=$1 pat=$2; shift 2
    out=$("$@" 2>&1); rc=$?
    [ "$rc" = "$code" ] || fail "'$*' exited $rc, expected $code; output: $out"
    case $out in *"$pat"*) ;; *) fail "'$*' output lacks '$pat': $out" ;; esac
    echo "ok: $* -> $rc ($pat)"
}

i=0; while [ $i -lt 200 ]; do echo "To be, or not to be: that is the question $i."; i=$((i+1)); done > "$dir/in.txt"
expect 0 "tokenizer   char (V = " "$DTRAIN" data prepare "$dir/in.txt" -o "$dir/out.tok" --tokenizer char
expect 0 "checksum    xxh3-64" "$DTRAIN" data info "$dir/out.tok"
expect 0 "begins      \"To be, or not" "$DTRAIN" data info "$dir/out.tok"
expect 0 "tokenizer   byte (V = 256)" env DT_TOKENIZER=byte "$DTRAIN" data prepare "$dir/in.txt" -o "$dir/b.tok"
expect 0 "text, tokenized in memory" "$DTRAIN" data info "$dir/in.txt" --tokenizer char
# One flipped byte in the middle of the tokens.
cp "$dir/out.tok" "$dir/bad.tok"
printf 'Z' | dd of="$dir/bad.tok" bs=1 seek=1000 conv=notrunc 2>/dev/null
expect 1 "bad.tok: checksum mismatch" "$DTRAIN" data info "$dir/bad.tok"
head -c 500 "$dir/out.tok" > "$dir/short.tok"
expect 1 "short.tok: truncated" "$DTRAIN" data info "$dir/short.tok"
expect 1 "missing.txt: no such file" "$DTRAIN" data prepare "$dir/missing.txt" -o "$dir/x.tok"
: > "$dir/empty.txt"
expect 2 "empty.txt: the file is empty" "$DTRAIN" data prepare "$dir/empty.txt" -o "$dir/x.tok"
[ ! -e "$dir/x.tok" ] || fail "a failed prepare left $dir/x.tok"
# An output that exists but is not a regular file is refused and left as
# it was (a rename used to replace it with a regular file; as root with
# -o /dev/null, /dev/null itself).
mkfifo "$dir/fifo"
expect 2 "is a FIFO, not a regular file" "$DTRAIN" data prepare "$dir/in.txt" -o "$dir/fifo"
[ -p "$dir/fifo" ] || fail "data prepare replaced the FIFO $dir/fifo"
ln -s /dev/null "$dir/null.tok"
expect 2 "is a character device" "$DTRAIN" data prepare "$dir/in.txt" -o "$dir/null.tok"
[ -L "$dir/null.tok" ] && [ -c /dev/null ] || fail "data prepare replaced $dir/null.tok"
if [ "$(id -u)" = 0 ] && mknod "$dir/dev.tok" c 1 3 2>/dev/null; then
    expect 2 "is a character device" "$DTRAIN" data prepare "$dir/in.txt" -o "$dir/dev.tok"
    [ -c "$dir/dev.tok" ] || fail "data prepare replaced the device node $dir/dev.tok"
fi
# A FIFO or a device as input is refused at once, never waited on.
expect 2 "not a regular file" timeout 20 "$DTRAIN" data info "$dir/fifo"
expect 2 "not a regular file" timeout 20 "$DTRAIN" data prepare /dev/zero -o "$dir/x.tok"
expect 2 "-o OUT.tok" "$DTRAIN" data prepare "$dir/in.txt"
expect 2 "--tokenizer" "$DTRAIN" data prepare "$dir/in.txt" -o "$dir/x.tok" --tokenizer bpe
expect 2 "unknown action 'frobnicate'" "$DTRAIN" data frobnicate
echo "all passed"
