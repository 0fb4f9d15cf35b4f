#!/bin/sh
# obs_report.sh DTRAIN SRC BUILD CASE — `dtrain report`'s page opened in a
# real headless Chromium (Debian's chromium package): the DOM after the
# page's scripts ran is checked by tests/obs_check.py (no JavaScript error,
# every chart drawn, the advice there).
#   page       a traced 2-rank run: every chart; a screenshot is written to
#              BUILD/report-screenshot.png; --compare with a second run
#   straggler  rank 1 made 4x slower (DT_FAULT_SLOW=1:4): the page's and the
#              terminal's advice name rank 1 as the straggler
#   predicted  a 2-rank dp run with the planner's predicted step for its
#              layout in RUN_DIR/trace/predicted.json (dtrain plan
#              --timeline-json): the report reads it by itself, prints
#              predicted against measured, and the page's timeline draws
#              the predicted lanes under the measured ones
# Exits 77 (skipped), saying why, only when chromium is not installed.
set -u
DTRAIN=$1 SRC=$2 BUILD=$3 CASE=$4
PY=/usr/bin/python3
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$CHROMIUM" ]; then
    echo "SKIP: chromium is not installed (scripts/install-deps.sh --torch or --browser installs it)"
    exit 77
fi
dir=$(mktemp -d "${TMPDIR:-/tmp}/dt_report.XXXXXX")
trap 'rm -rf "$dir"' EXIT
cd "$dir" || exit 1
fail() { echo "FAIL ($CASE): $*"; exit 1; }
common="--data $SRC/README.md --batch 4 --seq 64 --threads 1 --sample-tokens 0 --progress plain"
# shellcheck disable=SC2086
train() { "$DTRAIN" train $common "$@" > train.log 2>&1 || { cat train.log; fail "dtrain train $*"; }; }
# chrome ARGS... PAGE: headless, as root too (--no-sandbox), its profile here.
chrome() {
    timeout 120 "$CHROMIUM" --headless --no-sandbox --disable-gpu --no-first-run \
        --user-data-dir="$dir/profile" --virtual-time-budget=10000 "$@" 2> chrome.err
}
CHARTS=loss,throughput,mfu,breakdown,breakdown-steps,timeline,roofline,collectives,memory
case $CASE in
page)
    train --nproc 2 --steps 10 --eval-every 5 --trace --run-dir a
    "$DTRAIN" report a > report.log 2>&1 || { cat report.log; fail "dtrain report"; }
    grep -q "^report: *a/report.html" report.log || fail "report path not printed: $(cat report.log)"
    chrome --dump-dom "file://$dir/a/report.html" > dom.html || { cat chrome.err; fail "chromium"; }
    $PY "$SRC/tests/obs_check.py" dom dom.html --charts $CHARTS || fail "DOM checks"
    rm -f "$BUILD/report-screenshot.png"
    chrome --hide-scrollbars --window-size=1400,3400 --screenshot="$BUILD/report-screenshot.png" \
        "file://$dir/a/report.html" > /dev/null || { cat chrome.err; fail "screenshot"; }
    size=$(stat -c %s "$BUILD/report-screenshot.png" 2> /dev/null || echo 0)
    [ "$size" -gt 20000 ] || fail "screenshot of $size bytes"
    echo "ok: screenshot $BUILD/report-screenshot.png ($size bytes)"
    train --nproc 2 --steps 10 --eval-every 5 --trace --grad-dtype bf16 --run-dir b
    "$DTRAIN" report --compare a b -o compare.html > cmp.log 2>&1 || { cat cmp.log; fail "--compare"; }
    chrome --dump-dom "file://$dir/compare.html" > dom2.html || { cat chrome.err; fail "chromium"; }
    $PY "$SRC/tests/obs_check.py" dom dom2.html --charts $CHARTS,timeline-1 || fail "compare DOM checks"
    grep -q 'class="diff"><td>grad-dtype' dom2.html || fail "the differing option is not marked"
    ;;
straggler)
    DT_FAULT_SLOW=1:4 train --nproc 2 --steps 10 --trace --run-dir slow
    "$DTRAIN" report slow > report.log 2>&1 || { cat report.log; fail "dtrain report"; }
    grep -q "Rank 1 is a straggler" report.log || fail "no straggler advice: $(cat report.log)"
    chrome --dump-dom "file://$dir/slow/report.html" > dom.html || { cat chrome.err; fail "chromium"; }
    $PY "$SRC/tests/obs_check.py" dom dom.html --charts breakdown,timeline \
        --advice-rule straggler --advice-text "Rank 1 computes" || fail "DOM checks"
    ;;
predicted)
    train --nproc 2 --steps 8 --trace --run-dir a
    "$DTRAIN" plan --cluster this --model tiny --seq 64 --devices 2 --dp 2 --tp 1 --pp 1 --cp 1 \
        --micro-batch 4 --global-batch 8 --zero 0 --recompute none --precision fp32 \
        --timeline-json a/trace/predicted.json > plan.log 2>&1 || { cat plan.log; fail "plan"; }
    "$DTRAIN" report a > report.log 2>&1 || { cat report.log; fail "dtrain report"; }
    grep -q "^predicted: .* ms/step by dtrain plan (dp 2 x tp 1 x pp 1.*; measured .* ms" report.log ||
        fail "no predicted line: $(cat report.log)"
    chrome --dump-dom "file://$dir/a/report.html" > dom.html || { cat chrome.err; fail "chromium"; }
    $PY "$SRC/tests/obs_check.py" dom dom.html --charts timeline || fail "DOM checks"
    grep -q 'class="lbl pred"[^>]*>predicted rank 0 compute' dom.html || fail "no predicted lane drawn"
    grep -q '<rect[^>]*class="pred"' dom.html || fail "no predicted event drawn"
    ;;
*) fail "unknown case" ;;
esac
echo "all passed ($CASE)"
