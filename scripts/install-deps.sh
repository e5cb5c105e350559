#!/usr/bin/env bash
# Installs every Debian package ddpc uses: build tools, libraries (oneDNN for bf16 products on
# the CPU), test tools (clang and its
# libFuzzer runtime for scripts/fuzz.sh; python3-venv for scripts/tb-venv.sh; chromium, headless, for
# the report's screenshot test), the Fashion-MNIST data,
# the fortune texts (the default language-model job),
# and the peers our benchmarks compare against (Open MPI, PyTorch); a single-node Slurm (slurmctld,
# slurmd, munge) that integration.slurm starts itself to run `srun -n 2`. Idempotent: packages already
# present are skipped, so a second run makes no network calls. Works as root or through sudo.
set -euo pipefail

packages=(
    build-essential cmake pkg-config clang-format
    libopenblas-dev libyaml-dev zlib1g-dev libjansson-dev libdnnl-dev
    libcmocka-dev clang libclang-rt-14-dev python3-venv chromium
    dataset-fashion-mnist fortunes
    openmpi-bin libopenmpi-dev
    python3 python3-torch
    procps iproute2 util-linux
    slurmctld slurmd slurm-client munge
)

missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: all ${#packages[@]} packages already installed"
    exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
    sudo=()
elif command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
else
    echo "install-deps: need root or sudo to install: ${missing[*]}" >&2
    exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null
