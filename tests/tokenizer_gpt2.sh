#!/bin/sh
# tokenizer_gpt2.sh DTRAIN SRC — dtrain's GPT-2 tokenizer against
# js-tiktoken ("gpt2", under node), token for token: on a whole real
# corpus (the fortunes text of `make demo`, or the project's docs when
# fortunes is missing), on the project's own docs, and on a Unicode-heavy
# text of many scripts, numbers, symbols, emoji and kinds of space; then a
# learned vocabulary against GPT-2's original pair-merge BPE. Exits 77
# (skipped) when node, npm or the npm registry is not there.
set -u
DTRAIN=$1 SRC=$2
dir=$(mktemp -d "${TMPDIR:-/tmp}/dt_gpt2tok.XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
command -v node > /dev/null || { echo "skipped: node is not installed"; exit 77; }
tokdir=$("$SRC/scripts/get-gpt2-tokenizer.sh" --js) || { echo "skipped: cannot fetch the GPT-2 files or js-tiktoken"; exit 77; }
export DT_NODE_MODULES=${XDG_CACHE_HOME:-$HOME/.cache}/dtrain/node/node_modules
js=$SRC/tests/tokenizer/tiktoken.cjs
cd "$dir"

fortunes=/usr/share/games/fortunes
if [ -d $fortunes ]; then
    find $fortunes -type f ! -name '*.dat' ! -name '*.u8' ! -name '*art*' | sort | xargs cat > corpus.txt
else
    cat "$SRC/README.md" "$SRC"/docs/*.md > corpus.txt
fi
cat "$SRC/README.md" "$SRC"/docs/*.md > docs.txt
node "$js" unicode unicode.txt 400000 || fail "cannot write the Unicode text"
for f in corpus docs unicode; do
    "$DTRAIN" data prepare --tokenizer gpt2 $f.txt -o $f.tok > prep.log 2>&1 || fail "prepare $f: $(cat prep.log)"
    node "$js" compare $f.txt $f.tok || fail "$f.txt differs from js-tiktoken"
done
node "$js" merges "$tokdir" docs.txt docs.tok || fail "differs from GPT-2's pair merges"
# A learned vocabulary, saved in GPT-2's format, encodes as GPT-2's own
# algorithm does with its files.
"$DTRAIN" data tokenizer train --vocab-size 2000 -o learned corpus.txt || fail "tokenizer train"
"$DTRAIN" data prepare --tokenizer learned docs.txt -o learned.tok > prep.log 2>&1 || fail "$(cat prep.log)"
node "$js" merges learned docs.txt learned.tok || fail "the learned vocabulary"
"$DTRAIN" data prepare --tokenizer learned unicode.txt -o learned_u.tok > prep.log 2>&1 || fail "$(cat prep.log)"
node "$js" merges learned unicode.txt learned_u.tok || fail "the learned vocabulary, Unicode"
# GPT-2 data makes --model gpt2-124m the real GPT-2 shape (V = 50257).
"$DTRAIN" train --data docs.tok --model gpt2-124m --layers 1 --seq 32 --batch 1 --steps 1 \
    --threads 1 --no-save --sample-tokens 4 --progress plain > train.log 2>&1 || fail "$(cat train.log)"
grep -q "vocab 50257" train.log || fail "$(head -3 train.log)"
echo "all passed"
