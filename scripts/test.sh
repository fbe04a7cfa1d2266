#!/usr/bin/env bash
# Runs every test environment of tox.ini (its env_list):
#   docs            the documentation site, built strictly
#   typing          pyright over the packages and README's Python code (0 errors)
#   wheels          the five wheels and sdists built into dist/ (scripts/build-wheels.sh)
#   install-py310,  those wheels installed by pip alone, binary only and with no C compiler
#   install-py312   reachable, then `pjrt info`, README's code, `pjrt demo` and a LAPACK program
#                   run against them from outside the checkout (scripts/check-wheels.py)
#   core            the core and CPU plugin on two real XLA CPU plugins, jax as the oracle
#   vendor          the GPU/TPU vendors' real plugins
# tox runs each of them even when an earlier one fails, and exits non-zero if any failed.
# Installs tox into .venv-tox first if it is missing; arguments go to `tox run` (-e ENV,...).
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
# The install-py* environments find their Pythons as python3.10 and python3.12 on PATH. pyenv's
# shims answer for the active version only; where pyenv has the others installed, link them
# into .tox/pythons, first on PATH. (Only python3.X is linked: python3 and pip stay as they
# were. A version found nowhere fails its environment: skip_missing_interpreters is false.)
pythons=.tox/pythons
for version in 3.10 3.12; do
  if ! "python$version" -c "" >/dev/null 2>&1; then
    found=$(ls -d "${PYENV_ROOT:-${HOME:-}/.pyenv}/versions/$version".*/bin/"python$version" \
              2>/dev/null | sort -V | tail -n 1 || true)
    if [ -n "$found" ]; then
      mkdir -p "$pythons"
      ln -sfn "$found" "$pythons/python$version"
    fi
  fi
done
if [ -d "$pythons" ]; then
  export PATH="$PWD/$pythons:$PATH"
fi
"${tox[@]}" run "$@"
