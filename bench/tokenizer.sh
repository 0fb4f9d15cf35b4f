#!/usr/bin/env bash
# tokenizer.sh DTRAIN [FILE] [RUNS] — GPT-2 BPE encoding throughput of
# dtrain against js-tiktoken ("gpt2", under node) on the same file in the
# same session, medians of RUNS (default 5) each. FILE defaults to the
# fortunes text of `make demo`. Needs node and npm (the files and
# js-tiktoken come from scripts/get-gpt2-tokenizer.sh --js). Run it with
# nothing else on the machine: flock -x /tmp/dtrain-cpu.lock bench/tokenizer.sh build/dtrain
set -euo pipefail
DTRAIN=${1:?usage: tokenizer.sh DTRAIN [FILE] [RUNS]}
FILE=${2:-}
RUNS=${3:-5}
here=$(cd "$(dirname "$0")/.." && pwd)
"$here/scripts/get-gpt2-tokenizer.sh" --js > /dev/null
export DT_NODE_MODULES=${XDG_CACHE_HOME:-$HOME/.cache}/dtrain/node/node_modules
if [[ -z $FILE ]]; then
    FILE=$(mktemp)
    trap 'rm -f "$FILE"' EXIT
    find /usr/share/games/fortunes -type f ! -name '*.dat' ! -name '*.u8' ! -name '*art*' -print0 |
        sort -z | xargs -0 cat > "$FILE"
fi
ours=$("$DTRAIN" bench tokenizer --runs "$RUNS" --json "$FILE")
theirs=$(node "$here/tests/tokenizer/tiktoken.cjs" time "$FILE" "$RUNS")
python3 - "$ours" "$theirs" "$(lscpu | sed -n 's/^Model name: *//p')" <<'PY'
import json, sys
o, t, cpu = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
assert o["tokens"] == t["tokens"], (o["tokens"], t["tokens"])
mb = o["bytes"] / 1e6
print(f"# GPT-2 BPE, {o['bytes']} bytes -> {o['tokens']} tokens, medians, 1 thread each, {cpu}")
print(f"{'encoder':<24} {'seconds':>9} {'MB/s':>8} {'tokens/s':>12}")
for name, r in (("dtrain", o), ("js-tiktoken (node)", t)):
    print(f"{name:<24} {r['seconds']:9.4f} {mb / r['seconds']:8.2f} {r['tokens'] / r['seconds']:12.0f}")
print(f"dtrain / js-tiktoken: {t['seconds'] / o['seconds']:.1f}x")
PY
