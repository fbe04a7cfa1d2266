#!/usr/bin/env bash
# Prepares what scripts/gpu-check.sh installs on a GPU machine that has no network: pjrt's own
# wheels (the core, one cp310-abi3 wheel, and pjrt-cuda, pure Python) built here by
# scripts/build-wheels.sh, and the wheels of the core's two dependencies that such a machine
# may lack (cffi for CPython 3.12 on manylinux x86_64, and pycparser), all in one folder.
#
#   bash scripts/gpu-check-prepare.sh            # into .gpu-check/ (git ignores it)
#   bash scripts/gpu-check-prepare.sh DIR        # into DIR
#
# Needs what build-wheels.sh needs (Python 3.10+, a C compiler, PyPI). The folder stays well
# under the 64 MiB a machine is lent with the checkout; the vendor plugin and NVIDIA's
# libraries are not in it: gpu-check.sh uses those installed on the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."

folder=${1:-.gpu-check}
python=${PYTHON:-python3}

bash scripts/build-wheels.sh >/dev/null
rm -rf "$folder"
mkdir -p "$folder"
cp dist/pjrt-*.whl dist/pjrt_cuda-*.whl "$folder"/
"$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$folder" cffi pycparser

count=$(ls "$folder"/*.whl | wc -l)
if [ "$count" -ne 4 ]; then
  echo "expected 4 wheels in $folder (pjrt, pjrt-cuda, cffi, pycparser), found $count:" >&2
  ls "$folder" >&2
  exit 1
fi
echo "$folder: $(du -sh "$folder" | cut -f1)"
ls -1 "$folder"
echo "carry '$folder' with the checkout and run there: bash scripts/gpu-check.sh"
