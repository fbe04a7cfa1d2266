#!/usr/bin/env bash
# Runs every test environment in tox.ini: the core suite on two real XLA CPU plugins, and the
# GPU/TPU vendors' real plugins. Installs tox into .venv-tox first if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if python3 -m tox --version >/dev/null 2>&1; then
  tox=(python3 -m tox)
else
  python3 -m venv .venv-tox
  .venv-tox/bin/pip install --quiet "tox>=4"
  tox=(.venv-tox/bin/tox)
fi
"${tox[@]}" run -e core,vendor "$@"
