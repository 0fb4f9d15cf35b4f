#!/usr/bin/env bash
# install-deps.sh — install dtrain's Debian packages if any is missing.
#
# Idempotent and cheap when everything is present (one dpkg-query). As root
# it installs with apt-get; otherwise it prints the exact command and exits 1.
#
#   scripts/install-deps.sh            build, test and demo dependencies
#   scripts/install-deps.sh --torch    also PyTorch and what the PyTorch backend
#                                      (bindings/torch) builds against; its tests run;
#                                      node and npm for the tokenizer's reference;
#                                      chromium for the report's browser tests (CI)
#   scripts/install-deps.sh --bench    the same, for the peers used by bench/
#   scripts/install-deps.sh --browser  the build's packages and chromium only
#
# Where python3-torch is already installed, the backend's headers come too:
# its tests then run in `make test` and need the backend built.
set -euo pipefail

# Each package and why dtrain needs it (the README's dependency table).
PACKAGES=(
    cmake             # build system (>= 3.25)
    build-essential   # gcc, make, libc headers
    pkg-config        # locating libraries
    libopenblas-dev   # sgemm for the training kernels
    libxxhash-dev     # XXH3 checksums for checkpoints
    libjansson-dev    # JSON: config.json, --config, metrics.jsonl, bench --json, safetensors
    help2man          # the man pages `make install` installs
    libdnnl-dev       # oneDNN: bf16 matrix multiply on AMX / AVX512-BF16
    libopenmpi-dev    # MPI backend and the Open MPI peer in bench/compare-mpi.sh
    openmpi-bin       # mpirun, for tests under MPI
    iproute2          # ip netns / tc: the multi-host test bed
    fortunes          # an English text corpus for `make demo`
)
TORCH_PACKAGES=(
    python3-torch     # PyTorch: the backend's host, test fixtures, the bench/ peer
    python3-numpy
)
# The GPT-2 tokenizer's reference (js-tiktoken, fetched from npm into a cache
# by scripts/get-gpt2-tokenizer.sh): tests/tokenizer_gpt2.sh and
# bench/tokenizer.sh run under node. Wanted with --torch / --bench only when
# node or npm is not on the PATH already (a node from elsewhere, such as
# NodeSource's, bundles its npm and must not be replaced).
NODE_PACKAGES=(
    nodejs
    npm
)
# `dtrain report`'s page is tested in a real headless browser
# (tests/obs_report.sh; skipped without it).
BROWSER_PACKAGES=(
    chromium          # headless Chromium: the report's DOM and screenshot tests
)
TORCH_BUILD_PACKAGES=(
    libtorch-dev      # c10d headers and libraries the PyTorch backend builds against
    pybind11-dev      # the backend's Python module (the pybind11 torch was built with)
)

installed() {
    [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" == "install ok installed" ]]
}

want=("${PACKAGES[@]}")
case "${1:-}" in
    "") ;;
    --browser)
        want+=("${BROWSER_PACKAGES[@]}")
        ;;
    --torch | --bench)
        want+=("${TORCH_PACKAGES[@]}" "${TORCH_BUILD_PACKAGES[@]}" "${BROWSER_PACKAGES[@]}")
        if ! command -v node > /dev/null || ! command -v npm > /dev/null; then
            want+=("${NODE_PACKAGES[@]}")
        fi
        ;;
    *)
        echo "usage: $0 [--torch | --bench | --browser]" >&2
        exit 2
        ;;
esac
if installed python3-torch; then
    want+=("${TORCH_BUILD_PACKAGES[@]}")
fi

missing=()
for p in "${want[@]}"; do
    installed "$p" || missing+=("$p")
done

if [[ ${#missing[@]} -eq 0 ]]; then
    exit 0
fi

cmd="apt-get install -y --no-install-recommends ${missing[*]}"
if [[ $(id -u) -ne 0 ]]; then
    echo "dtrain: missing Debian packages: ${missing[*]}" >&2
    echo "install them with:  sudo apt-get update && sudo $cmd" >&2
    exit 1
fi
echo "dtrain: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
$cmd
