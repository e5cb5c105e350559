#!/usr/bin/env bash
# The README's second command: install dependencies, build, run the whole test suite under CTest.
# Works on a machine without make: install-deps.sh brings it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
exec make test
