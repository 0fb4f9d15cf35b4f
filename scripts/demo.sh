#!/usr/bin/env bash
# demo.sh BUILD_DIR — the README's main job: train a small character-level
# GPT data-parallel with 2 processes on real English text, watch it learn,
# then print a generated sample and where the checkpoint and metrics are.
#
# Text: DATA=path/to/file.txt, else the prose of the `fortunes` Debian
# package (/usr/share/games/fortunes, installed by scripts/install-deps.sh;
# the ASCII-art collections are left out). No network needed.
# Knobs (environment): STEPS (default 800), NPROC (2), OUT (BUILD_DIR/demo).
# The learning-rate warm-up is a sixteenth of the steps (50 of 800), so any
# STEPS works.
# Each run starts afresh; RESUME=1 continues from the last checkpoint instead.
set -euo pipefail
BUILD=${1:-build}
OUT=${OUT:-$BUILD/demo}
STEPS=${STEPS:-800}
NPROC=${NPROC:-2}
WARMUP=$((STEPS / 16))
mkdir -p "$OUT"
resume=()
if [[ "${RESUME:-0}" == 1 ]]; then
    resume=(--resume)
else
    rm -rf "$OUT/ckpt" "$OUT/run"
fi

if [[ -n "${DATA:-}" ]]; then
    corpus=$DATA
else
    dir=/usr/share/games/fortunes
    if [[ ! -d $dir ]]; then
        echo "demo: $dir is missing: install the 'fortunes' package (make deps) or set DATA=file.txt" >&2
        exit 1
    fi
    corpus=$OUT/fortunes.txt
    find "$dir" -type f ! -name '*.dat' ! -name '*.u8' ! -name '*art*' -print0 | sort -z |
        xargs -0 cat > "$corpus"
fi
echo "demo: $(wc -c < "$corpus") bytes of text from $corpus; $NPROC processes, $STEPS steps"

# A 4-layer, 128-channel character-level GPT (0.8M parameters), context 128,
# batch 8 per process: a few minutes on 2 cores.
"$BUILD/dtrain" train \
    --model shakespeare-char --layers 4 --dim 128 --heads 4 --seq 128 \
    --data "$corpus" --val-split 0.05 --nproc "$NPROC" --batch 8 --steps "$STEPS" \
    --lr 2e-3 --min-lr 2e-4 --warmup "$WARMUP" --schedule cosine --clip 1.0 --weight-decay 0.1 \
    --eval-every 100 --eval-batches 16 \
    --ckpt-dir "$OUT/ckpt" --ckpt-every 100 --keep 2 "${resume[@]}" \
    --run-dir "$OUT/run" --sample-tokens 400

echo
echo "checkpoint: $("$BUILD/dtrain" ckpt info "$OUT/ckpt" | head -1 | sed 's/^file: *//')"
echo "metrics:    $OUT/run/metrics.jsonl (one JSON line per step), config: $OUT/run/config.json"
echo "inspect:    $BUILD/dtrain ckpt info $OUT/ckpt"
