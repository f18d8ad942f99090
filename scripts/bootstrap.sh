#!/usr/bin/env bash
# Create .venv (Python 3.12) and install moe_vlm with its dev tools at the exact versions of
# constraints.txt (pyproject.toml holds only ranges). Idempotent and quick when nothing changed:
# a stamp of pyproject.toml and constraints.txt skips the install.
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
  for candidate in python3.12 "$HOME/.pyenv/versions/3.12"*/bin/python3.12 /usr/bin/python3.12 /usr/local/bin/python3.12; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      command -v "$candidate"; return 0
    fi
  done
  echo "bootstrap: Python 3.12 not found (Megatron needs it). Install python3.12 and rerun." >&2
  return 1
}

if [ ! -x .venv/bin/python ]; then
  "$(find_python)" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
fi
stamp=.venv/.moe_vlm-installed
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install --quiet -c constraints.txt -e '.[dev]'
  echo "$want" > "$stamp"
fi
