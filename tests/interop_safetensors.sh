#!/bin/sh
# interop_safetensors.sh DTRAIN LOGITS_DUMP SRC — weights interop: a trained
# model exported as safetensors (Hugging Face GPT-2 names and layouts) gives
# the PyTorch reference model of tests/reference the logits dtrain computes;
# export -> import -> export is byte-identical; llm.c's model format (written
# by the reference from the same weights) reads back to the same tensors;
# --init-from starts training from each. Exits 77 without PyTorch.
set -u
DTRAIN=$1 DUMP=$2 SRC=$3
PY=/usr/bin/python3
REF=$SRC/tests/reference/safetensors_gpt2.py
$PY -c "import torch, numpy" 2> /dev/null || { echo "skipped: $PY cannot import torch"; exit 77; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/dt_interop.XXXXXX")
trap 'rm -rf "$dir"' EXIT
cd "$dir" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
cat "$SRC/README.md" "$SRC/docs/train.md" > in.txt
# dim 128 with 2 heads: a head size that is not GPT-2's 64 (dtrain.heads).
"$DTRAIN" train --data in.txt --model tiny --layers 2 --dim 128 --heads 2 --seq 32 --batch 4 \
    --steps 20 --lr 3e-3 --threads 1 --sample-tokens 0 --progress plain --run-dir run > train.log 2>&1 ||
    fail "train: $(cat train.log)"
"$DTRAIN" export run -o a.safetensors || fail "export"
"$DTRAIN" export a.safetensors -o b.safetensors || fail "export of the export"
cmp a.safetensors b.safetensors || fail "export -> import -> export is not byte-identical"
echo "ok: export -> import -> export byte-identical"
ids="3 17 42 5 9 30 11 2 8 23 15 4"
"$DUMP" a.safetensors ours.bin $ids || fail "logits_dump"
$PY "$REF" logits a.safetensors ours.bin $ids || fail "the reference's logits differ"
"$DUMP" run/model.dtgw ours2.bin $ids || fail "logits_dump"
cmp ours.bin ours2.bin || fail "the exported model computes other logits than the weights file"
# llm.c's format, written independently from the same weights.
$PY "$REF" llmc a.safetensors m.bin || fail "writing the llm.c file"
"$DTRAIN" export m.bin -o c.safetensors || fail "export of the llm.c file"
$PY "$REF" same a.safetensors c.safetensors || fail "the llm.c file reads back other tensors"
"$DUMP" m.bin ours3.bin $ids || fail "logits_dump"
cmp ours.bin ours3.bin || fail "the llm.c file computes other logits"
# --init-from: the run goes on from the file's weights. Each file holds the
# same weights, so the first step's loss is the same bits from each, and far
# below a fresh model's (~ln V) on the same batch.
first_loss() {
    "$DTRAIN" train --data in.txt "$@" --steps 1 --batch 4 --seq 32 --threads 1 \
        --sample-tokens 0 --progress plain --no-save > init.log 2>&1 || fail "$*: $(cat init.log)"
    sed -n 's/^done: .*loss \([0-9.]*\) -> .*/\1/p' init.log
}
fresh=$(first_loss --model tiny --layers 2 --dim 128 --heads 2)
want=$(first_loss --init-from run)
$PY -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if a < b - 0.5 else 1)" \
    "$want" "$fresh" || fail "--init-from run starts at loss $want, a fresh model at $fresh"
for f in a.safetensors m.bin; do
    loss=$(first_loss --init-from $f)
    [ "$loss" = "$want" ] || fail "--init-from $f starts at loss $loss, --init-from run at $want"
done
echo "ok: --init-from run, a.safetensors, m.bin: first loss $want each (a fresh model: $fresh)"
expect_err() {
    out=$("$@" 2>&1) && fail "'$*' succeeded"
    echo "$out" | grep -q "is not a model file" || fail "'$*': $out"
}
expect_err "$DTRAIN" train --data in.txt --init-from in.txt --no-save
echo "all passed"
