#!/bin/sh
# obs_trace.sh DTRAIN SRC CASE — `dtrain train --trace` end to end, checked
# by tests/obs_check.py (docs/observability.md):
#   ranks3  three ranks: every trace file is Chrome-trace JSON, events nest per
#           thread, every collective starts on all ranks before it ends on any
#           (ranks on one kernel: exactly, on one clock), the step breakdown of
#           every rank in metrics.jsonl adds up, summary.json has its means
#   skew    rank 1's trace clock 5 s ahead and 300 ppm fast (DT_FAULT_CLOCK):
#           the alignment through the store finds both within its bound and
#           the collectives still order
#   window  --trace-steps 2:3 records those steps only; bad knobs are refused
#           naming them; `dtrain report` refuses a damaged metrics file
set -u
DTRAIN=$1 SRC=$2 CASE=$3
PY=/usr/bin/python3
dir=$(mktemp -d "${TMPDIR:-/tmp}/dt_obs.XXXXXX")
trap 'rm -rf "$dir"' EXIT
cd "$dir" || exit 1
fail() { echo "FAIL ($CASE): $*"; exit 1; }
common="--data $SRC/README.md --batch 4 --seq 64 --threads 1 --sample-tokens 0 --progress plain"
# shellcheck disable=SC2086
train() { "$DTRAIN" train $common "$@" > train.log 2>&1 || { cat train.log; fail "dtrain train $*"; }; }
case $CASE in
ranks3)
    train --nproc 3 --steps 6 --eval-every 3 --trace --run-dir r3
    grep -q "^time/step:" train.log || fail "no breakdown in the summary"
    grep -q "trace:.*r3/trace/trace.json" train.log || fail "the summary does not name the trace"
    $PY "$SRC/tests/obs_check.py" trace r3 --world 3 || fail "trace checks"
    ;;
skew)
    DT_FAULT_CLOCK=1:5000:300 train --nproc 2 --steps 6 --trace --run-dir skew
    $PY "$SRC/tests/obs_check.py" trace skew --world 2 --skew 1:5000:300 || fail "trace checks"
    ;;
window)
    train --nproc 2 --steps 5 --trace --trace-steps 2:3 --run-dir w
    steps=$($PY -c 'import json,sys
d=json.load(open("w/trace/trace.json"))
print(sorted({e["args"]["step"] for e in d["traceEvents"] if e.get("name")=="step" and e["ph"]=="X"}))')
    [ "$steps" = "[2, 3]" ] || fail "--trace-steps 2:3 recorded steps $steps"
    echo "ok: --trace-steps 2:3 recorded $steps"
    out=$("$DTRAIN" train $common --steps 2 --trace --trace-steps 5:2 --run-dir x 2>&1) && fail "--trace-steps 5:2 accepted"
    case $out in *"--trace-steps"*) ;; *) fail "--trace-steps 5:2: $out" ;; esac
    out=$("$DTRAIN" train $common --steps 2 --trace --no-save 2>&1) && fail "--trace --no-save accepted"
    case $out in *"--trace"*"--run-dir"*) ;; *) fail "--trace --no-save: $out" ;; esac
    out=$(DT_FAULT_CLOCK=one "$DTRAIN" train $common --steps 2 --trace --run-dir y 2>&1) && fail "DT_FAULT_CLOCK=one accepted"
    case $out in *"DT_FAULT_CLOCK=one"*) ;; *) fail "DT_FAULT_CLOCK=one: $out" ;; esac
    [ -d w/trace ] && [ ! -e y/trace/trace.json ] || fail "trace files where none belong"
    train --steps 2 --run-dir plain
    [ ! -e plain/trace ] || fail "a trace without --trace"
    grep -q '"breakdown"' plain/metrics.jsonl || fail "no breakdown in metrics.jsonl without --trace"
    "$DTRAIN" report -q plain > rep.log 2>&1 || { cat rep.log; fail "report of an untraced run"; }
    [ -s plain/report.html ] || fail "no plain/report.html"
    printf '{"step": 3, "loss": 1}\nnot json\n' >> plain/metrics.jsonl
    out=$("$DTRAIN" report plain 2>&1) && fail "a damaged metrics.jsonl accepted"
    case $out in *"metrics.jsonl: line 4"*) ;; *) fail "damaged metrics: $out" ;; esac
    out=$("$DTRAIN" report "$dir" 2>&1) && fail "a folder without metrics accepted"
    case $out in *"no metrics.jsonl"*) ;; *) fail "no metrics: $out" ;; esac
    echo "ok: bad input refused"
    ;;
*) fail "unknown case" ;;
esac
echo "all passed ($CASE)"
