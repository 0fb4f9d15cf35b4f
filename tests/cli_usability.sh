#!/bin/sh
# cli_usability.sh DTRAIN SRC CASE — the everyday experience of the dtrain
# command, one numbered defect of issue 19 per CASE (each failed before its
# fix): what a user coming from torchrun, nanoGPT or llm.c runs, and what
# they must see. Each case runs in its own scratch folder.
set -u
DTRAIN=$1 SRC=$2 CASE=$3
dir=$(mktemp -d "${TMPDIR:-/tmp}/dt_usability.XXXXXX")
trap 'rm -rf "$dir"' EXIT
cd "$dir" || exit 1
fail() { echo "FAIL ($CASE): $*"; exit 1; }
# ctest sets DT_NO_SAVE=1 for the other tests; these see the defaults.
unset DT_NO_SAVE
# expect CODE PATTERN CMD...: run CMD, check its exit code and that its
# output (stdout + stderr) contains PATTERN.
expect() {
    code=$1 pat=$2
    shift 2
    out=$("$@" 2>&1)
    rc=$?
    [ "$rc" = "$code" ] || fail "'$*' exited $rc, expected $code; output: $out"
    case $out in *"$pat"*) ;; *) fail "'$*' output lacks '$pat': $out" ;; esac
    echo "ok: $* -> $rc ($pat)"
}
# refuse PATTERN CMD...: CMD's output must not contain PATTERN.
refuse() {
    pat=$1
    shift
    out=$("$@" 2>&1)
    case $out in *"$pat"*) fail "'$*' output contains '$pat': $out" ;; esac
    echo "ok: $* (no '$pat')"
}
# A small English corpus.
i=0
while [ $i -lt 300 ]; do
    echo "To be, or not to be, that is the question $i: whether 'tis nobler in the mind."
    i=$((i + 1))
done > in.txt
SMALL="--model tiny --layers 1 --dim 32 --heads 2 --seq 32 --batch 4 --threads 1 --sample-tokens 0 --progress plain"

case $CASE in
demo_steps) # 1: the demo's warm-up scales with STEPS
    # One thread per rank: two spinning OpenMP threads on a loaded 2-core
    # machine made this take minutes instead of seconds.
    export DT_THREADS=1
    STEPS=40 NPROC=1 OUT=$dir/demo DATA=$dir/in.txt bash "$SRC/scripts/demo.sh" "$(dirname "$DTRAIN")" \
        > demo.log 2>&1 || fail "STEPS=40 make demo failed: $(tail -5 demo.log)"
    grep -q "done: steps 1..40" demo.log || fail "no summary: $(tail -5 demo.log)"
    STEPS=5 NPROC=1 OUT=$dir/demo DATA=$dir/in.txt bash "$SRC/scripts/demo.sh" "$(dirname "$DTRAIN")" \
        > demo.log 2>&1 || fail "STEPS=5 make demo failed: $(tail -5 demo.log)"
    ;;
run_dir) # 2: every run is saved (runs/MODEL-TIME), --no-save opts out, the summary says where
    expect 0 "run:        runs/tiny-" "$DTRAIN" train --data in.txt --steps 3 $SMALL
    run=$(ls -d runs/tiny-* | head -1)
    for f in config.json metrics.jsonl model.dtgw ckpt/ckpt-000003.dtck; do
        [ -e "$run/$f" ] || fail "$run/$f missing"
    done
    expect 0 "checkpoint: $run/ckpt/ckpt-000005.dtck" "$DTRAIN" train --data in.txt --steps 5 $SMALL --resume
    # sample without --ckpt takes the newest run, as nanoGPT's sample.py its out/
    expect 0 "sampling from $run (the newest run here" "$DTRAIN" sample --prompt "To be" --tokens 5
    [ "$(ls -d runs/tiny-* | wc -l)" = 1 ] || fail "--resume started a new run folder: $(ls runs)"
    [ -e "$run/ckpt/ckpt-000005.dtck" ] || fail "--resume did not continue $run"
    rm -rf runs
    expect 0 "saved:      nothing (--no-save)" "$DTRAIN" train --data in.txt --steps 2 $SMALL --no-save
    [ ! -e runs ] || fail "--no-save wrote runs/"
    DT_NO_SAVE=1 "$DTRAIN" train --data in.txt --steps 2 $SMALL > /dev/null 2>&1
    [ ! -e runs ] || fail "DT_NO_SAVE=1 wrote runs/"
    # Two runs started in the same second get two folders.
    "$DTRAIN" train --data in.txt --steps 1 $SMALL > a.log 2>&1 &
    "$DTRAIN" train --data in.txt --steps 1 $SMALL > b.log 2>&1
    wait
    [ "$(ls -d runs/tiny-* | wc -l)" = 2 ] || fail "two runs share a folder: $(ls runs)"
    ;;
tokenizer_default) # 3: one tokenizer default for data prepare, data info and train
    expect 0 "tokenizer   char" "$DTRAIN" data prepare in.txt -o in.tok
    expect 0 "tokenizer   char" "$DTRAIN" data info in.txt
    expect 0 "vocab 33" "$DTRAIN" train --data in.txt --steps 1 $SMALL --no-save
    expect 0 "vocab 33" "$DTRAIN" train --data in.tok --steps 1 $SMALL --no-save
    ;;
model_paths) # 4: every command that reads a model takes any model path
    "$DTRAIN" train --data in.txt --steps 2 $SMALL --run-dir run > train.log 2>&1 || fail "train: $(cat train.log)"
    for p in run run/ckpt run/ckpt/ckpt-000002.dtck run/model.dtgw; do
        expect 0 "To be" "$DTRAIN" sample --ckpt "$p" --prompt "To be" --tokens 5
    done
    expect 0 "format:    dtrain weights" "$DTRAIN" ckpt info run/model.dtgw
    expect 0 "step:      2" "$DTRAIN" ckpt info run
    expect 0 "wrote run/model.safetensors" "$DTRAIN" export run/model.dtgw
    expect 0 "format:    safetensors" "$DTRAIN" ckpt info run/model.safetensors
    expect 2 "in.txt is not a model file" "$DTRAIN" sample --ckpt in.txt
    expect 2 "there is no runs/*/model.dtgw here" "$DTRAIN" sample
    expect 1 "is a folder without a model" "$DTRAIN" sample --ckpt "$dir"
    expect 2 "is not a model file" "$DTRAIN" ckpt info in.txt
    ;;
mfu_peak) # 5: MFU against a cached peak per compute type, --peak-flops overrides
    export XDG_CACHE_HOME=$dir/cache
    expect 0 "fp32 peak: measured now" "$DTRAIN" train --data in.txt --steps 1 $SMALL --no-save
    [ -s cache/dtrain/peak.json ] || fail "no peak cache written"
    expect 0 "fp32 peak: $dir/cache/dtrain/peak.json" "$DTRAIN" train --data in.txt --steps 1 $SMALL --no-save
    # A cached value is used as it is, in the run's own compute type.
    python3 - "$dir/cache/dtrain/peak.json" <<'PY' || fail "cannot edit the cache"
import json, sys
p = sys.argv[1]
d = json.load(open(p))
for k, v in d["peaks"].items():
    v["flops"] = 1.25e12 if k.endswith("|fp32") else 7.5e12
json.dump(d, open(p, "w"))
PY
    expect 0 "MFU relative to 1250.0 GFLOP/s per rank (fp32 peak" "$DTRAIN" train --data in.txt --steps 1 $SMALL --no-save
    refuse "is above 100%" "$DTRAIN" train --data in.txt --steps 2 $SMALL --no-save
    # A peak far below what the machine does (a cache written while it was
    # busy) gives MFU over 100%, which the summary calls out.
    python3 -c "import json,sys; p=sys.argv[1]; d=json.load(open(p)); [v.update(flops=1e6) for k,v in d['peaks'].items() if k.endswith('|fp32')]; json.dump(d, open(p,'w'))" \
        "$dir/cache/dtrain/peak.json" || fail "cannot edit the cache"
    expect 0 "is above 100%: the peak it is relative to is lower" "$DTRAIN" train --data in.txt --steps 2 $SMALL --no-save
    expect 0 "bf16 peak: measured now, bf16" "$DTRAIN" train --data in.txt --steps 1 $SMALL --no-save --precision bf16
    expect 0 "MFU relative to 2000.0 GFLOP/s per rank (bf16 peak: --peak-flops)" \
        "$DTRAIN" train --data in.txt --steps 1 $SMALL --no-save --precision bf16 --peak-flops 2e12
    expect 0 "fp32 " "$DTRAIN" bench peak --precision fp32 --threads 1
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert any(v['flops'] != 1.25e12 for k,v in d['peaks'].items() if k.endswith('|1|fp32'))" \
        cache/dtrain/peak.json || fail "bench peak did not re-measure"
    ;;
buckets) # 6: the default bucket adapts to the model, so backward overlaps
    expect 0 "bucket(s) of <= 1.00 MiB" "$DTRAIN" train --data in.txt --steps 1 $SMALL --no-save
    out=$("$DTRAIN" train --data in.txt --steps 6 --model tiny --layers 4 --dim 128 --heads 4 --seq 64 \
        --batch 2 --nproc 2 --threads 1 --sample-tokens 0 --progress plain --no-save 2>&1) ||
        fail "2 ranks: $out"
    n=$(echo "$out" | sed -n 's/.* \([0-9]*\) of \([0-9]*\) buckets started during backward.*/\1 \2/p')
    [ -n "$n" ] || fail "no bucket line: $out"
    set -- $n
    [ "$2" -ge 2 ] && [ "$1" -ge 1 ] || fail "$1 of $2 buckets started during backward: $out"
    echo "ok: $1 of $2 buckets started during backward"
    ;;
flags) # 7: one name and one short flag per concept across every command
    "$DTRAIN" --help | sed -n 's/^  \([a-z]*\) .*/\1/p' | grep -v '^help$' > cmds
    : > shorts
    for c in $(cat cmds); do
        "$DTRAIN" help "$c" > h.txt
        sed -n 's/^  -\(.\), --\([a-z0-9-]*\).*/\1 \2/p' h.txt | sed "s/^/$c /" >> shorts
        subs=$(sed -n 's/^  \([a-z0-9-]*\)  .*/\1/p' h.txt)
        for s in $subs; do
            "$DTRAIN" help "$c" "$s" 2>/dev/null | sed -n 's/^  -\(.\), --\([a-z0-9-]*\).*/\1 \2/p' |
                sed "s/^/$c-$s /" >> shorts
        done
    done
    # Each letter names one option everywhere (-h is help).
    bad=$(awk '{print $2, $3}' shorts | sort -u | awk '{n[$1]++; o[$1]=o[$1] " " $2} END {for (k in n) if (n[k] > 1) print "-" k ":" o[k]}')
    [ -z "$bad" ] || fail "short flags with several meanings: $bad"
    grep -q "^bench-comm n nproc" shorts || fail "bench comm has no -n/--nproc: $(grep bench-comm shorts)"
    grep -q "^train n nproc" shorts && grep -q "^launch n nproc" shorts || fail "-n is not --nproc"
    expect 0 "#wrong" "$DTRAIN" bench comm --nproc 2 --sizes 1K:4K --iters 2 --warmup 1
    expect 0 "#wrong" "$DTRAIN" bench comm --np 2 --sizes 1K:4K --iters 2 --warmup 1
    expect 2 "unknown option '-t'" "$DTRAIN" launch -t -n 1 true
    ;;
config_json) # 8: config.json is valid JSON with the flags' names and feeds --config
    mkdir "$(printf 'd\377ir')"
    cp in.txt "$(printf 'd\377ir')/in.txt"
    "$DTRAIN" train --data "$(printf 'd\377ir')/in.txt" --steps 4 $SMALL --val-split 0.05 --min-lr 1e-4 \
        --lr 3e-3 --grad-dtype bf16 --bucket-size 2M --run-dir a > a.log 2>&1 || fail "run a: $(cat a.log)"
    python3 - a/config.json <<'PY' || fail "config.json: $(cat a/config.json)"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["val-split"] == 0.05 and c["min-lr"] == 1e-4 and c["grad-dtype"] == "bf16", c
assert c["bucket-size"] == 2 << 20 and "\ufffd" in c["data"], c
PY
    grep -q '"val-split": 0.05,' a/config.json || fail "floats print long: $(grep val-split a/config.json)"
    cp in.txt in2.txt
    python3 -c "import json,sys; c=json.load(open('a/config.json')); c['data']='in2.txt'; json.dump(c, open('cfg.json','w'))"
    "$DTRAIN" train --config cfg.json --run-dir b > b.log 2>&1 || fail "run b: $(cat b.log)"
    python3 - a/metrics.jsonl b/metrics.jsonl <<'PY' || fail "--config did not reproduce the run"
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
assert len(a) == 4 and a == b, (a, b)
PY
    printf 'lr = 3e-3\nsteps = 2\n' > kv.cfg
    expect 0 "done: steps 1..2" "$DTRAIN" train --data in.txt --config kv.cfg $SMALL --no-save
    printf '{"steps": 2, "max_iters": 3}' > bad.json
    expect 2 "unknown key 'max_iters' (did you mean '--steps'?)" "$DTRAIN" train --data in.txt --config bad.json
    python3 -c "import json,sys; [json.loads(l) for l in open(sys.argv[1])]" a/metrics.jsonl || fail "metrics.jsonl"
    "$DTRAIN" bench compress --codec int8 --count 4096 --iters 1 --json | python3 -c "import json,sys; [json.loads(l) for l in sys.stdin]" ||
        fail "bench --json is not JSON"
    ;;
torchrun) # 9: torchrun's variables and OMP_NUM_THREADS work as DT_* do
    port=$((20000 + $$ % 12000))
    for r in 0 1; do
        env -u DT_RANK RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
            MASTER_PORT=$port OMP_NUM_THREADS=1 TORCHELASTIC_RUN_ID=usability \
            "$DTRAIN" train --data in.txt --steps 2 --model tiny --layers 1 --dim 32 --heads 2 --seq 32 \
            --batch 2 --sample-tokens 0 --progress plain --no-save > rank$r.log 2>&1 &
    done
    wait
    grep -q "2 rank(s) x batch 2" rank0.log || fail "torchrun variables ignored: $(cat rank0.log)"
    grep -q "1 thread(s)/rank" rank0.log || fail "OMP_NUM_THREADS ignored: $(cat rank0.log)"
    # ... and by every command that takes --threads.
    expect 0 "1 thread(s)" env OMP_NUM_THREADS=1 "$DTRAIN" bench gemm --size 64 --reps 1
    expect 0 "1 thread(s)" env OMP_NUM_THREADS=1 "$DTRAIN" bench memcpy --size 1M --iters 1
    grep -q "done: steps 1..2" rank0.log || fail "$(cat rank0.log rank1.log)"
    if /usr/bin/python3 -c "import torch.distributed.run" 2>/dev/null; then
        # (--redirects/--tee 2: torch 1.13's defaults of 0 fail under Python 3.11)
        /usr/bin/python3 -m torch.distributed.run --nproc_per_node 2 --master_port $((port + 7)) \
            --redirects 2 --tee 2 --no_python \
            "$DTRAIN" train --data in.txt --steps 2 $SMALL --no-save > torchrun.log 2>&1 ||
            fail "under torchrun: $(cat torchrun.log)"
        grep -q "2 rank(s)" torchrun.log || fail "under torchrun: $(cat torchrun.log)"
        echo "ok: under torchrun --nproc_per_node 2"
    fi
    ;;
warnings) # 10: what used to be silent says so
    expect 0 "have no effect here: with one data-parallel rank" \
        "$DTRAIN" train --data in.txt --steps 1 $SMALL --no-save --compress int8
    "$DTRAIN" train --data in.txt --steps 4 $SMALL --run-dir r > /dev/null 2>&1 || fail "run"
    expect 0 "had --steps 4, this one 8: the cosine schedule is stretched" \
        "$DTRAIN" train --data in.txt --steps 8 $SMALL --run-dir r --resume
    expect 0 "nothing to train: r/ckpt/ckpt-000008.dtck is at step 8 of --steps 8" \
        "$DTRAIN" train --data in.txt --steps 8 $SMALL --run-dir r --resume
    ;;
errors) # 11: errors read as messages, unknown flags get suggestions, root causes win
    expect 1 "no such file" "$DTRAIN" train --data missing.txt $SMALL
    refuse "    at " "$DTRAIN" train --data missing.txt $SMALL
    expect 1 "    at " env DT_LOG=debug "$DTRAIN" train --data missing.txt $SMALL
    expect 2 "ambiguous option '--ckpt': it could be --ckpt-dir, --ckpt-every" "$DTRAIN" train --ckpt x
    expect 2 "unknown option '--learning-rate' (did you mean '--lr'?)" "$DTRAIN" train --learning-rate 1
    expect 2 "unknown option '--batch-size' (did you mean '--batch'?)" "$DTRAIN" train --batch-size 1
    expect 2 "unknown option '--max-iters' (did you mean '--steps'?)" "$DTRAIN" train --max-iters 1
    expect 2 "unknown option '--min_lr' (did you mean '--min-lr'?)" "$DTRAIN" train --min_lr 1
    expect 2 "unknown option '--nproc_per_node' (did you mean '--nproc'?)" "$DTRAIN" launch --nproc_per_node 2 true
    expect 2 "(did you mean '--steps'?)" "$DTRAIN" train --stesp 3
    expect 2 "unknown option '--device' (dtrain trains on the CPU" "$DTRAIN" train --device=cpu
    expect 2 "unknown option '--dropout' (dtrain's GPT has no dropout)" "$DTRAIN" train --dropout 0.1
    # A resume mismatch under 2 ranks: the launcher quotes the cause.
    "$DTRAIN" train --data in.txt --steps 2 $SMALL --ckpt-dir ck --no-save > /dev/null 2>&1 || fail "run"
    expect 1 "written with dim 32, this run has dim 64" "$DTRAIN" train --data in.txt --steps 4 \
        --model tiny --layers 1 --dim 64 --heads 2 --seq 32 --batch 2 --threads 1 --nproc 2 \
        --sample-tokens 0 --progress plain --ckpt-dir ck --no-save --resume
    refuse "rank 0 could not load" "$DTRAIN" train --data in.txt --steps 4 \
        --model tiny --layers 1 --dim 64 --heads 2 --seq 32 --batch 2 --threads 1 --nproc 2 \
        --sample-tokens 0 --progress plain --ckpt-dir ck --no-save --resume
    # Out of memory says what would fit.
    i=0
    while [ $i -lt 12 ]; do cat in.txt in.txt in.txt in.txt in.txt; i=$((i + 1)); done > big.txt
    cat big.txt big.txt > big2.txt
    expect 1 "Activations would take: --recompute blocks" "$DTRAIN" train --data big2.txt --model tiny \
        --layers 64 --dim 512 --heads 4 --seq 1024 --batch 64 --steps 1 --val-split 0 --no-save --threads 1
    ;;
help) # 12: help for actions, printable defaults, complete and true texts, one preset
    expect 0 "usage: dtrain ckpt info" "$DTRAIN" help ckpt info
    expect 0 "usage: dtrain bench comm" "$DTRAIN" help bench comm
    expect 0 "usage: dtrain plan memory" "$DTRAIN" help plan memory
    expect 0 "usage: dtrain data tokenizer train" "$DTRAIN" help data tokenizer train
    expect 0 "--nproc" "$DTRAIN" help bench comm
    refuse "exported" "$DTRAIN" help bench comm
    expect 0 '[default: \n]' "$DTRAIN" sample --help
    expect 0 "topk, randk, powersgd" "$DTRAIN" help train
    expect 2 "has no action 'frob'" "$DTRAIN" help bench frob
    expect 0 "vocab 50257" "$DTRAIN" train --data in.txt --model gpt2-124m --layers 1 --dim 64 --heads 1 \
        --seq 16 --batch 1 --steps 1 --threads 1 --sample-tokens 0 --no-save --progress plain
    ;;
zero3_files) # ZeRO 3 (each rank keeps its pieces) and offload meet the run folder
    # The run folder, its checkpoint and its config.json work as for any
    # run: every model reader sees the whole model, bit-identical to DDP's.
    mkdir off
    Z="--data in.txt --steps 2 $SMALL --layers 2 --nproc 2"
    "$DTRAIN" train $Z --zero 3 --offload optimizer=disk:off --run-dir z3 > z3.log 2>&1 ||
        fail "zero 3: $(cat z3.log)"
    "$DTRAIN" train $Z --run-dir z0 > z0.log 2>&1 || fail "zero 0: $(cat z0.log)"
    python3 -c "import json,sys; c=json.load(open('z3/config.json')); assert c['zero'] == 3 and c['offload'] == 'optimizer=disk:off', c" ||
        fail "config.json: $(cat z3/config.json)"
    for p in z3 z3/ckpt z3/model.dtgw z0; do
        "$DTRAIN" export "$p" -o "$(echo "$p" | tr / _).safetensors" > /dev/null 2>&1 || fail "export $p"
    done
    cmp z3.safetensors z3_ckpt.safetensors && cmp z3.safetensors z3_model.dtgw.safetensors ||
        fail "the zero-3 checkpoint and weights differ"
    cmp z3.safetensors z0.safetensors || fail "zero 3 and DDP trained different weights"
    expect 0 "To be" "$DTRAIN" sample --ckpt z3/ckpt --prompt "To be" --tokens 5
    expect 0 "resumed from z3/ckpt/ckpt-000002.dtck" \
        "$DTRAIN" train --config z3/config.json --run-dir z3 --resume --steps 3
    [ -z "$(ls -A off)" ] || fail "offload files left: $(ls off)"
    expect 0 "done: steps 1..1" "$DTRAIN" train --data in.txt --steps 1 --init-from z3 --batch 4 \
        --threads 1 --sample-tokens 0 --progress plain --nproc 2 --zero 3 --no-save
    ;;
*)
    fail "unknown case"
    ;;
esac
echo "all passed"
