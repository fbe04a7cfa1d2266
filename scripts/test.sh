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
# The Redis store's tests start a real redis-server on 127.0.0.1; install it where we can
# (they skip, saying why, where it is missing).
if ! command -v redis-server >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 \
    && [ "$(id -u)" = 0 ]; then
  (apt-get install -y -qq redis-server >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq redis-server >/dev/null 2>&1; }) \
    || echo "note: redis-server could not be installed; the Redis store's tests will be skipped"
fi
"${tox[@]}" run -e core,vendor "$@"
