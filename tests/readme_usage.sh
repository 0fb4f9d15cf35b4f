#!/bin/bash
# readme_usage.sh BUILD SRC — run the README's Usage section as written:
# its shell block, command by command, in a scratch folder where build/ and
# scripts/ are this tree's and input.txt is the project's own prose. Only
# the sizes shrink (steps, sizes, token counts; the substitutions below), so
# that the whole block runs in about a minute. Commands that need what the
# machine may lack are skipped with a note: mpirun (Open MPI), torchrun
# (PyTorch; Debian's torch 1.13 under Python 3.11 needs --redirects/--tee
# given, which the wrapper below adds), the GPT-2 lines (the npm registry).
set -u
BUILD=$1 SRC=$2
dir=$(mktemp -d "${TMPDIR:-/tmp}/dt_readme.XXXXXX")
trap 'rm -rf "$dir"' EXIT
cd "$dir" || exit 1
ln -s "$BUILD" build
ln -s "$SRC/scripts" scripts
cat "$SRC/README.md" "$SRC"/docs/*.md > input.txt
unset DT_NO_SAVE # ctest sets it for the other tests; the README runs with the defaults
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# (and a port of its own: 29500, torchrun's default, may be taken by another job)
torchrun() {
    /usr/bin/python3 -m torch.distributed.run --redirects 2 --tee 2 \
        --master_port $((30000 + $$ % 20000)) "$@"
}

# The block: from "## Usage" to its closing fence; continuation lines joined.
awk '/^## Usage/ {u = 1} u && /^```sh/ {b = 1; next} b && /^```/ {exit} b' "$SRC/README.md" |
    sed -e ':a' -e '/\\$/N; s/\\\n */ /; ta' | grep -v '^\s*#' | grep -v '^\s*$' > commands.sh
[ "$(wc -l < commands.sh)" -ge 20 ] || { echo "FAIL: the Usage block has $(wc -l < commands.sh) commands"; exit 1; }
sed -i -e 's/--steps 800/--steps 4/; s/--steps 1000/--steps 6/; s/--steps 100 /--steps 2 /' \
    -e 's/--steps 10$/--steps 1 --warmup 0/; s/--eval-every 100/--eval-every 2/' \
    -e 's/--ckpt-every 100/--ckpt-every 2/; s/--warmup 50/--warmup 1/; s/--tokens 200/--tokens 10/' \
    -e 's/8:64M/8:64K/; s/--seq 256/--seq 32/; s/--vocab-size 4096/--vocab-size 512/' \
    -e '/dtrain train --model gpt2-124m/s/$/ --eval-batches 1 --sample-tokens 4/' commands.sh

gpt2=1 ran=0 skipped=0
while IFS= read -r cmd; do
    why=""
    case $cmd in
    mpirun*) command -v mpirun > /dev/null || why="no mpirun" ;;
    torchrun*) /usr/bin/python3 -c "import torch.distributed.run" 2> /dev/null || why="no PyTorch" ;;
    *gpt2*) [ $gpt2 = 1 ] || why="no GPT-2 tokenizer files" ;;
    esac
    if [ -n "$why" ]; then
        echo "skipped ($why): $cmd"
        skipped=$((skipped + 1))
        continue
    fi
    echo "run: $cmd"
    # Open MPI's own allocations at exit upset LeakSanitizer (the MPI tests
    # are "noasan" for that reason): no leak check for an mpirun line.
    case $cmd in
    mpirun*) cmd="ASAN_OPTIONS=\${ASAN_OPTIONS:+\$ASAN_OPTIONS:}detect_leaks=0 $cmd" ;;
    esac
    start=$(date +%s)
    if ! eval "$cmd" < /dev/null > out.log 2>&1; then
        case $cmd in
        scripts/get-gpt2-tokenizer.sh*) gpt2=0; echo "  (cannot fetch: the GPT-2 lines are skipped)"; continue ;;
        esac
        echo "FAIL: exited non-zero:"
        tail -20 out.log
        exit 1
    fi
    echo "  ok in $(($(date +%s) - start)) s: $(tail -1 out.log | cut -c1-100)"
    ran=$((ran + 1))
done < commands.sh
echo "$ran commands ran, $skipped skipped"
[ -f run/ckpt/ckpt-000006.dtck ] || { echo "FAIL: the resumed run did not reach step 6"; exit 1; }
[ -f model.safetensors ] && [ -f pp.svg ] || { echo "FAIL: export or plan wrote nothing"; exit 1; }
echo "all passed"
