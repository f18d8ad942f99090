#!/usr/bin/env bash
# The test command: set up .venv, start the services the tests need, run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/python -m pytest "$@"
