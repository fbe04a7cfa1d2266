#!/usr/bin/env bash
# Sets up .venv with the core and the CPU plugin from this checkout, then runs the demo: the
# CPU plugin's devices, a StableHLO program on one device and one sharded over eight.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv
.venv/bin/pip install --quiet ./core ./plugins/cpu
.venv/bin/python -m pjrt demo
