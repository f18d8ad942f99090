#!/usr/bin/env bash
# The test command: set up .venv, start the services the tests need, run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
# The real Megatron stack for tests/megatron (a no-op once installed; without pip's wheel cache
# the Transformer Engine build takes about 10 minutes on 2 cores). If it cannot be installed,
# tests/megatron skip and say why, loudly, in the summary.
bash scripts/install_megatron.sh || echo "test.sh: scripts/install_megatron.sh failed; tests/megatron will be skipped" >&2
# A real single-node Slurm for tests/integration/test_slurm*.py (munge + slurmctld + slurmd, see
# scripts/slurm_local.sh). As root it is installed and started, and the Slurm tests then FAIL if it
# is not answering; without root they skip and say why.
if [ "$(id -u)" = 0 ]; then
  if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
  fi
  if ! bash scripts/slurm_local.sh status >/dev/null 2>&1; then
    trap 'bash scripts/slurm_local.sh stop' EXIT  # stop only the Slurm this script started
  fi
  eval "$(bash scripts/slurm_local.sh start)"
  export MOE_VLM_SLURM=1
else
  echo "test.sh: not root, so no local Slurm: tests marked slurm will be skipped" >&2
fi
# The layering (docs/layout.md): no import from a lower layer up, no import cycle, the two engines
# apart (contracts in pyproject.toml [tool.importlinter]).
.venv/bin/lint-imports
# Both cores (pytest-xdist): one worker per core, a test file's tests on one worker, and every
# Slurm test on one worker (tests/conftest.py groups them: the local node runs one test's jobs at a
# time). MOE_VLM_TEST_WORKERS=0 runs in this process, one test after another.
.venv/bin/python -m pytest -n "${MOE_VLM_TEST_WORKERS:-2}" --dist loadgroup "$@"
