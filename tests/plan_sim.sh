#!/bin/sh
# plan_sim.sh DTRAIN SRC CASE — the planner's step simulation from the
# command line (docs/planner.md, "The step simulation"):
#   timeline  `dtrain plan --timeline-json` writes a predicted timeline that
#             is a valid Chrome trace (tests/obs_check.py predicted: fields,
#             lanes one task at a time, one process per pipeline stage, the
#             last event at the printed simulated step); with --json the
#             flag (here as DT_PLAN_TIMELINE_JSON) keeps stdout JSON
#   errors    bad values get clear errors naming the value: an unwritable
#             or directory path for --timeline-json, a missing or foreign
#             file for `dtrain report --predicted`; a good one is overlaid
set -u
DTRAIN=$1 SRC=$2 CASE=$3
PY=/usr/bin/python3
dir=$(mktemp -d "${TMPDIR:-/tmp}/dt_plansim.XXXXXX")
trap 'rm -rf "$dir"' EXIT
cd "$dir" || exit 1
fail() { echo "FAIL ($CASE): $*"; exit 1; }
PLAN="--model gpt2-350m --global-batch 64 --devices 16 --dp 4 --tp 1 --pp 4 --cp 1 --micro-batch 2
      --zero 1 --recompute none --pp-schedule 1f1b --precision bf16
      --cluster $SRC/examples/clusters/dgx-a100.json"
case $CASE in
timeline)
    # shellcheck disable=SC2086
    "$DTRAIN" plan $PLAN --timeline-json t.json > out.log 2>&1 || { cat out.log; fail "plan"; }
    cat out.log
    step=$(sed -n 's/^simulated: \([0-9.e+-]*\) s\/step.*/\1/p' out.log)
    [ -n "$step" ] || fail "no simulated step printed"
    $PY "$SRC/tests/obs_check.py" predicted t.json --processes 4 --step-s "$step" || fail "t.json"
    # shellcheck disable=SC2086
    DT_PLAN_TIMELINE_JSON=t2.json "$DTRAIN" plan $PLAN --json > j.json 2> err.log ||
        { cat err.log; fail "plan --json"; }
    $PY -c 'import json,sys; json.load(open("j.json"))' || fail "stdout is not JSON with the timeline"
    grep -q "^simulated: .*t2.json" err.log || fail "no simulated line on stderr: $(cat err.log)"
    cmp -s t.json t2.json || fail "the same plan wrote two different timelines"
    ;;
errors)
    # shellcheck disable=SC2086
    "$DTRAIN" plan $PLAN --timeline-json /nonexistent-dir/t.json > out.log 2>&1 &&
        fail "an unwritable path was accepted"
    grep -q "/nonexistent-dir/t.json" out.log || fail "the path is not named: $(cat out.log)"
    mkdir d
    # shellcheck disable=SC2086
    "$DTRAIN" plan $PLAN --timeline-json d > out.log 2>&1 && fail "a directory was accepted"
    grep -q "refusing to replace d: it is a directory" out.log || fail "unclear: $(cat out.log)"
    # shellcheck disable=SC2086
    "$DTRAIN" plan $PLAN --timeline-json t.json > /dev/null 2>&1 || fail "plan"
    "$DTRAIN" train --data "$SRC/README.md" --batch 2 --seq 32 --steps 2 --threads 1 \
        --sample-tokens 0 --progress plain --run-dir r > train.log 2>&1 || { cat train.log; fail "train"; }
    "$DTRAIN" report r -q --predicted missing.json > out.log 2>&1 && fail "a missing file was accepted"
    grep -q "missing.json: no such file" out.log || fail "unclear: $(cat out.log)"
    echo '{"traceEvents":[], "otherData": {}}' > foreign.json
    "$DTRAIN" report r -q --predicted foreign.json > out.log 2>&1 && fail "a foreign file was accepted"
    grep -q "foreign.json: otherData.predicted is not true: not a predicted timeline" out.log ||
        fail "unclear: $(cat out.log)"
    "$DTRAIN" report r --predicted t.json > out.log 2>&1 || { cat out.log; fail "report --predicted"; }
    grep -q "^predicted: .* ms/step by dtrain plan (dp 4 x tp 1 x pp 4 (1f1b)" out.log ||
        fail "no predicted line: $(cat out.log)"
    grep -q '"predicted":{' r/report.html || fail "the page does not hold the predicted step"
    ;;
*) fail "unknown case" ;;
esac
echo "ok ($CASE)"
