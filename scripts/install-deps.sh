#!/usr/bin/env bash
# install-deps.sh — install dtrain's Debian packages if any is missing.
#
# Idempotent and cheap when everything is present (one dpkg-query). As root
# it installs with apt-get; otherwise it prints the exact command and exits 1.
#
#   scripts/install-deps.sh            build, test and demo dependencies
#   scripts/install-deps.sh --bench    also the peers used by bench/ (PyTorch)
set -euo pipefail

# Each package and why dtrain needs it (the README's dependency table).
PACKAGES=(
    cmake             # build system (>= 3.25)
    build-essential   # gcc, make, libc headers
    pkg-config        # locating libraries
    libopenblas-dev   # sgemm for the training kernels
    libxxhash-dev     # XXH3 checksums for checkpoints
    libdnnl-dev       # oneDNN: bf16 matrix multiply on AMX / AVX512-BF16
    libopenmpi-dev    # MPI backend and the Open MPI peer in bench/compare-mpi.sh
    openmpi-bin       # mpirun, for tests under MPI
    iproute2          # ip netns / tc: the multi-host test bed
    fortunes          # an English text corpus for `make demo`
)
BENCH_PACKAGES=(
    python3-torch     # PyTorch: numerical reference fixtures and the bench/ peer
    python3-numpy
)

want=("${PACKAGES[@]}")
if [[ "${1:-}" == "--bench" ]]; then
    want+=("${BENCH_PACKAGES[@]}")
fi

missing=()
for p in "${want[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [[ "$status" == "install ok installed" ]] || missing+=("$p")
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
