#!/usr/bin/env bash
# bench/elastic.sh [DTRAIN] [ROUNDS] — what losing a rank costs, two ways,
# on the same work in the same run: shakespeare-char (the preset, T 128,
# --global-batch 12) on 4 ranks x 1 thread, a checkpoint after every step;
# rank 2 SIGKILLs itself in the middle of step 10 (DT_FAULT_KILL=2:10:mid,
# after reading its batch, while the others compute and exchange):
#
#   elastic   `dtrain train --nproc 4 --elastic 2:4`: the 3 others drop it
#             and go on in their processes (docs/fault-tolerance.md);
#   restart   `dtrain launch -n 4 --max-restarts 1 -- dtrain train --resume`:
#             the launcher stops the others and starts 4 new ranks, which
#             resume from the checkpoint of step 9.
#
# From the ranks' DT_DATA_TRACE records (each rank stamps the start of every
# step): "recovery" is the kill to the first step started again (state
# restored, training resumes), "step 10 done" the kill to the end of the
# step that was cut short, computed again. The two runs alternate, ROUNDS
# times (default 3); medians. The text is ../shared/data/tinyshakespeare.txt
# when present, else README.md.
set -euo pipefail
dtrain=${1:-build/dtrain}
rounds=${2:-3}
source "$(dirname "$0")/train_lib.sh"

common=(--model shakespeare-char --seq 128 --global-batch 12 --steps 12 --ckpt-every 1 --keep 3
        --lr 1e-3 --warmup 2)

# times DIR: prints "recovery step_done step_ms" (seconds, seconds, ms) from
# the trace files in DIR.
times() {
    python3 - "$1" <<'EOF'
import glob, os, statistics, sys
recs = []
for path in glob.glob(os.path.join(sys.argv[1], "trace-*.txt")):
    pid = int(os.path.basename(path)[6:-4])
    for line in open(path):
        f = line.split()
        if len(f) >= 6 and line.endswith("\n"):
            recs.append((float(f[0]), int(f[1]), int(f[2]), int(f[4]), pid))
first = {}  # pid -> its first step
for t, g, s, r, pid in recs:
    first[pid] = min(first.get(pid, s), s)
# The victim: rank 2 of the first processes, its (last) read of step 10.
kill = max(t for t, g, s, r, pid in recs if s == 10 and r == 2 and first[pid] == 1 and g <= 0)
again = [t for t, g, s, r, pid in recs if s == 10 and t > kill and (g >= 1 or first[pid] > 1)]
done = [t for t, g, s, r, pid in recs if s == 11]
# A step's time before the loss: rank 0's starts of steps 5..9.
r0 = sorted(t for t, g, s, r, pid in recs if r == 0 and 5 <= s <= 9 and first[pid] == 1 and g <= 0)
step = statistics.median(b - a for a, b in zip(r0, r0[1:]))
print(f"{min(again) - kill:.3f} {min(done) - kill:.3f} {1000 * step:.0f}")
EOF
}

declare -a e_rec e_done e_step r_rec r_done r_step
for ((i = 1; i <= rounds; i++)); do
    mkdir -p "$work/te$i" "$work/tr$i"
    DT_FAULT_KILL=2:10:mid DT_DATA_TRACE="$work/te$i" \
        train_run "elastic$i" "${common[@]}" --nproc 4 --elastic 2:4
    read -r a b c < <(times "$work/te$i")
    e_rec+=("$a") e_done+=("$b") e_step+=("$c")
    grep -q "generation 1: 3 rank(s), lost ranks 2" "$work/elastic$i.log" || {
        echo "elastic.sh: the elastic run did not shrink:" >&2
        tail -n 5 "$work/elastic$i.log" >&2
        exit 1
    }
    rm -rf "${work:?}/restart$i"
    DT_FAULT_KILL=2:10:mid DT_DATA_TRACE="$work/tr$i" "$dtrain" launch -n 4 --max-restarts 1 \
        --grace 5 -- "$dtrain" train --data "$data" --threads 1 --peak-flops 1e9 \
        --sample-tokens 0 --progress plain --val-split 0 --run-dir "$work/restart$i" \
        --resume "${common[@]}" >"$work/restart$i.log" 2>&1 || {
        echo "elastic.sh: the restarted run failed:" >&2
        tail -n 5 "$work/restart$i.log" >&2
        exit 1
    }
    read -r a b c < <(times "$work/tr$i")
    r_rec+=("$a") r_done+=("$b") r_step+=("$c")
    echo "round $i: elastic ${e_rec[-1]} s / ${e_done[-1]} s, restart ${r_rec[-1]} s / ${r_done[-1]} s" >&2
done

er=$(med "${e_rec[*]}") ed=$(med "${e_done[*]}") es=$(med "${e_step[*]}")
rr=$(med "${r_rec[*]}") rd=$(med "${r_done[*]}") rs=$(med "${r_step[*]}")
echo "shakespeare-char, T 128, global batch 12, 4 ranks x 1 thread, a checkpoint every step;"
echo "rank 2 killed in the middle of step 10; medians of $rounds rounds (s)"
echo
echo "| Run | Step before (ms) | Kill -> training resumes | Kill -> step 10 done again | Ranks after |"
echo "| --- | --- | --- | --- | --- |"
echo "| elastic (--elastic 2:4) | $es | $er | $ed | 3 |"
echo "| restart (--max-restarts 1, --resume) | $rs | $rr | $rd | 4 |"
awk -v e="$er" -v r="$rr" -v ed="$ed" -v rd="$rd" \
    'BEGIN {printf "\nrestart / elastic: %.1fx to resume, %.1fx to step 10 done again\n", r / e, rd / ed}'
