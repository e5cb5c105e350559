#!/usr/bin/env bash
# Makes a Python virtual environment with the `tensorboard` package from PyPI, for reading and
# viewing the event files ddpc writes (tests/python/test_tb.py; `VENV/bin/tensorboard --logdir
# runs/x/tb`). Debian carries no tensorboard package, and its python3 refuses `pip install`
# outside a venv (PEP 668), so this leaves Debian's python untouched. Idempotent: an existing venv
# that imports tensorboard is kept, and then no network is used.
# Usage: scripts/tb-venv.sh [VENV]   (default build/tb-venv). Exit 0: ready; 1: it could not be
# made (offline, no python3-venv); the reason is on stderr.
set -uo pipefail
venv=${1:-build/tb-venv}
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3)

if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import tensorboard" 2>/dev/null; then
    exit 0
fi
if ! "$py" -m venv --clear "$venv" >/dev/null; then
    echo "tb-venv: '$py -m venv $venv' failed; install Debian's python3-venv" >&2
    exit 1
fi
# Short network timeouts: offline, this fails in seconds rather than minutes.
if ! "$venv/bin/pip" install --quiet --disable-pip-version-check --timeout 20 --retries 1 \
    tensorboard >&2; then
    echo "tb-venv: 'pip install tensorboard' into $venv failed (offline, or PyPI unreachable?)" >&2
    exit 1
fi
"$venv/bin/python" -c "import tensorboard" || exit 1
