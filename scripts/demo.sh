#!/usr/bin/env bash
# The README's first command: install dependencies, build, run the main job.
# Works on a machine without make: install-deps.sh brings it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
exec make demo
