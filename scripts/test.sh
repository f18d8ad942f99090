#!/usr/bin/env bash
# The test command: set up .venv, start the services the tests need, run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
# The real Megatron stack for tests/megatron (a no-op once installed; without pip's wheel cache
# the Transformer Engine build takes about 10 minutes on 2 cores). If it cannot be installed,
# tests/megatron skip and say why, loudly, in the summary.
bash scripts/install_megatron.sh || echo "test.sh: scripts/install_megatron.sh failed; tests/megatron will be skipped" >&2
.venv/bin/python -m pytest "$@"
