#!/usr/bin/env bash
# The test command: set up .venv, start the services the tests need, run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
# The real Megatron stack for tests/megatron (a no-op once installed; without pip's wheel cache
# the Transformer Engine build takes about 10 minutes on 2 cores). If it cannot be installed,
# tests/megatron skip and say why, loudly, in the summary.
bash scripts/install_megatron.sh || echo "test.sh: scripts/install_megatron.sh failed; tests/megatron will be skipped" >&2
# A real two-node local Slurm for tests/integration/test_slurm*.py (munge + slurmctld + a slurmd per node, see
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
# Bytecode for the project's own modules, written once here. Where PYTHONDONTWRITEBYTECODE is set
# (CI images set it) nothing else writes it, and every Python process the tests start (each
# train.py run, each of its ranks, each Slurm job) would compile the project's modules it imports
# again: all 172 take about 1.8 s. Python still checks each .pyc against its source's mtime.
.venv/bin/python -m compileall -q -j 0 moe_vlm hydra_plugins scripts train.py >/dev/null
# The layering (docs/layout.md): no import from a lower layer up, no import cycle, the two engines
# apart (contracts in pyproject.toml [tool.importlinter]).
.venv/bin/lint-imports
# Both cores: the Slurm tests (marker `slurm`) in one process, one after another (the local node
# has 2 CPUs: two tests' jobs would run against each other's time limits), while the rest run on
# pytest-xdist workers (MOE_VLM_TEST_WORKERS, default 2; a test file's tests stay on one worker, so
# its module fixtures are built once; files with the most slow tests go first, tests/conftest.py).
# MOE_VLM_TEST_WORKERS=0 runs everything in this process.
workers="${MOE_VLM_TEST_WORKERS:-2}"
if [ "$workers" = 0 ]; then
  .venv/bin/python -m pytest "$@"
  exit $?
fi
slurm_log=$(mktemp -t moe_vlm_slurm_tests.XXXXXX)
.venv/bin/python -m pytest -m slurm -p no:xdist "$@" >"$slurm_log" 2>&1 &
slurm_pid=$!
set +e
# The slowest tests are listed, so CI time can be watched where it goes.
.venv/bin/python -m pytest -m "not slurm" -n "$workers" --dist loadfile --no-loadscope-reorder --durations=30 "$@"
rest=$?
wait "$slurm_pid"
slurm=$?
echo "=================== the Slurm tests (pytest -m slurm, run alongside) ==================="
cat "$slurm_log"
rm -f "$slurm_log"
set -e
# 5: no test selected (arguments that name none of a group's tests).
ok() { [ "$1" = 0 ] || [ "$1" = 5 ]; }
if ok "$rest" && ok "$slurm" && ! { [ "$rest" = 5 ] && [ "$slurm" = 5 ]; }; then
  exit 0
fi
echo "test.sh: pytest exited $rest (not slurm) and $slurm (slurm)" >&2
exit 1
