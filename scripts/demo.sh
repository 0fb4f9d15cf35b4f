#!/usr/bin/env bash
# demo.sh BUILD_DIR — the README's main job.
set -euo pipefail
BUILD=${1:-build}
"$BUILD/dtrain" version
"$BUILD/dtrain" bench rng --count 64M
