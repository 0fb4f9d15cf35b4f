#!/usr/bin/env bash
# eval_netns.sh DTRAIN CODEC... — bench/compression-eval.sh in a tiny mode
# (tiny model, 8 timed steps at 100 Mbit/s, 12-step unshaped quality runs,
# the given codecs) on a corpus made of the repository's docs: the table
# must have one sane row per codec (positive times, none at 1.00x and
# +0.00%, a compressed codec sending fewer bytes than none, the whole-run
# time charging warm-up steps at none's step time and a ramp's steps at
# their timed sum, finite validation losses), the shaped and unshaped runs
# of none (and the ramp run of an entry whose warm-up is <= --skip) must
# have trained the same losses (the script's loss check), and nothing may be left
# behind: no namespaces, no processes; then the same run is interrupted
# with SIGINT while training and must clean up as well and exit 130.
# Exits 77 (ctest SKIP_RETURN_CODE) when not root or a tool is missing.
set -euo pipefail
dtrain=$1
shift
codecs="$*"
root=$(cd "$(dirname "$0")/../.." && pwd)
if [[ $(id -u) -ne 0 ]]; then
    echo "SKIP: the netns evaluation needs root (network namespaces, tc)"
    exit 77
fi
for t in ip tc python3; do
    if ! command -v $t >/dev/null; then
        echo "SKIP: the netns evaluation needs '$t'"
        exit 77
    fi
done
fail() { echo "FAIL: $*" >&2; exit 1; }
export DT_NETNS_PREFIX=dte$$
# dtrain's own bound on every wait, well inside ctest's 90 s: a rank or
# launcher that cannot make progress fails with a message instead of hanging.
export DT_TIMEOUT=30
dir=$(mktemp -d /tmp/dt-evaltest-XXXXXX)
trap 'rm -rf "$dir"; "$root/scripts/netns-cluster.sh" down 2 >/dev/null 2>&1 || true' EXIT
cat "$root"/docs/*.md >"$dir/corpus.txt"
leftovers() {
    local n
    n=$(ip netns list | awk '{print $1}' | grep -c "^$DT_NETNS_PREFIX-" || true)
    [[ $n == 0 ]] || fail "$1: $n namespaces $DT_NETNS_PREFIX-* left"
    ! pgrep -f -- "$dir/" >/dev/null || fail "$1: processes left: $(pgrep -af -- "$dir/")"
}
eval_args=(--dtrain "$dtrain" --model tiny --batch 4 --seq 64 --steps 8 --skip 2
    --quality-steps 12 --rates 100mbit --codecs "$codecs" "$dir/corpus.txt")

timeout -k 5 60 "$root/bench/compression-eval.sh" "${eval_args[@]}" --out "$dir/run" \
    >"$dir/out.txt" 2>&1 ||
    fail "compression-eval.sh exited $? (124: still running after 60 s): $(tail -n 20 "$dir/out.txt" "$dir"/run/*/*/node*.log 2>/dev/null)"
cat "$dir/out.txt"
leftovers "after a run"
grep -q "delay 0.5ms" "$dir/out.txt" || fail "no line saying whether the delay is emulated"
# shellcheck disable=SC2086 # one argument per codec
python3 - "$dir/out.txt" $codecs <<'PY' || fail "table not sane (see above)"
import math, re, sys
lines = open(sys.argv[1]).read().splitlines()
codecs = sys.argv[2:]
head = [i for i, l in enumerate(lines) if l.startswith("link ")]
assert len(head) == 1, f"expected one table header, found {len(head)}"
rows = {}
for l in lines[head[0] + 1:]:
    f = l.split()
    if len(f) == 11 and f[0] == "100mbit":
        rows[f[1]] = f
assert sorted(rows) == sorted(codecs), f"rows {sorted(rows)} != codecs {sorted(codecs)}"
for c, f in rows.items():
    step, comp, exp, mb, run_s, val = (float(x) for x in (f[2], f[3], f[4], f[5], f[7], f[9]))
    assert step > 0 and comp > 0 and exp >= 0 and mb > 0, f"{c}: non-positive figures {f}"
    assert comp <= step * 1.001, f"{c}: compute {comp} ms above step {step} ms"
    assert math.isfinite(val) and 0 < val < 10, f"{c}: val loss {val}"
    sp = float(f[6].rstrip("x"))
    assert sp > 0, f"{c}: speed-up {f[6]}"
# The quality runs: 12 steps each, unshaped.
for c in codecs:
    assert any(re.search(rf"quality +{re.escape(c)} +val [0-9.]+ after 12 steps", l) for l in lines), \
        f"no 12-step quality run for {c}"
if "none" in rows:
    n = rows["none"]
    assert n[6] == "1.00x" and n[8] == "1.00x" and n[10] == "+0.00%", f"none vs itself: {n}"
    assert abs(float(n[7]) - 12 * float(n[2]) / 1e3) < 0.06, f"none: run s {n[7]} != 12 x {n[2]} ms"
    for c, f in rows.items():
        if c.split("@")[0] not in ("none", "fp16", "bf16"):
            assert float(f[5]) < float(n[5]) / 2, f"{c} sends {f[5]} MB/step, none {n[5]}"
        # Whole run: warm-up steps at none's step time, the ramp's steps at
        # their timed sum (the script's "ramp:" line), the rest at the codec's.
        m = re.match(r"^[^@+]+(?:@(\d+)(?:~(\d+))?(/v)?)?(?:\+d\d+)?$", c)
        assert m, f"entry {c} does not parse"
        w, ramp = int(m[1] or 0), int(m[2] or 0)
        ramp_s, tol = 0.0, 0.06
        if ramp:
            rl = [l for l in lines if l.startswith(f"ramp: 100mbit {c}: the {ramp} ramp steps ")]
            assert len(rl) == 1, f"{c}: no ramp line"
            ramp_s, tol = float(rl[0].split(" ramp steps ")[1].split(" s,")[0]), 0.06
            assert ramp_s > 0, rl
        want = (w * float(n[2]) + (12 - w - ramp) * float(f[2])) / 1e3 + ramp_s
        assert abs(float(f[7]) - want) < tol, f"{c}: run s {f[7]}, expected {want:.2f}"
    # The shaped run and the unshaped one of none trained identically, and
    # so did the ramp run of an entry with a warm-up <= --skip 2.
    chk = [l for l in lines if l.startswith("loss check:")]
    assert len(chk) == 1 and "agree bit for bit over steps 1..8" in chk[0] and "100mbit/none" in chk[0], chk
    for c in rows:
        m = re.match(r"^[^@+]+@(\d+)~\d+", c)
        if m and int(m[1]) <= 2:
            assert f"100mbit/{c}(ramp)" in chk[0].split(), f"{c}: ramp run not checked: {chk}"
print("ok: table has one sane row per codec:", " ".join(codecs))
PY
echo "ok: nothing left after a run"

# Interrupt during training: launchers, ranks and namespaces must go.
set -m
# (A fresh --out: the first run's metrics.jsonl must not pass for this one's.)
"$root/bench/compression-eval.sh" "${eval_args[@]}" --steps 100000 --quality-steps 100000 --out "$dir/run2" \
    >"$dir/int.txt" 2>&1 &
pid=$!
first=${codecs%% *}
metrics=$dir/run2/100mbit/${first//[:@\/]/-}/metrics.jsonl
for ((i = 0; i < 300; i++)); do
    [[ -s $metrics ]] && break
    sleep 0.1
done
[[ -s $metrics ]] || fail "training did not start: $(cat "$dir/int.txt")"
kill -INT "$pid"
# The script stops its launchers (TERM, then KILL after 5 s) and removes the
# namespaces: allow 30 s, then say what is still running.
for ((i = 0; i < 300; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
done
if kill -0 "$pid" 2>/dev/null; then
    echo "still running 30 s after SIGINT:" >&2
    pgrep -af -- "$dir/|compression-eval|netns-cluster" >&2 || true
    tail -n 20 "$dir/int.txt" "$dir"/run2/100mbit/*/node*.log >&2 || true
    kill -KILL "$pid" 2>/dev/null || true
    fail "the interrupted evaluation did not exit"
fi
rc=0
wait "$pid" || rc=$?
set +m
[[ $rc == 130 ]] || fail "interrupted run exited $rc, expected 130: $(tail -n 5 "$dir/int.txt")"
leftovers "after SIGINT"
echo "ok: SIGINT during training: exit 130, nothing left"
