#!/usr/bin/env bash
# Checks pjrt on this machine's NVIDIA GPUs, in one command: installs pjrt and pjrt-cuda from
# the wheels scripts/gpu-check-prepare.sh put in .gpu-check/ (with --no-index --no-deps into
# /tmp/pjrt-site, leaving numpy, torch and jax as they are), then runs, each step with its
# verdict and reason (scripts/gpu-check.py):
#
#   vendor-plugin  which CUDA plugin wheel pjrt-cuda found, and NVIDIA's pip libraries
#   pjrt-info      pjrt info, with the cuda backend up
#   pjrt-conform   pjrt conform cuda
#   readme         README.md's Python blocks, on the CUDA plugin
#   sharded        a program over a mesh of all local GPUs (with one GPU, a 1-device mesh)
#   profile        a program run under pjrt.profiler.trace: pjrt's events, and the CUDA
#                  plugin's own device activity in a non-empty .xplane.pb
#   dlpack-torch   a torch tensor on the GPU into pjrt, through a program, and back; then
#                  torch work on a non-default stream into pjrt and a long pjrt program read
#                  by torch on that stream, synchronised through the plugin's stream extension
#   linalg         jax's linear algebra (solve ... tridiagonal_solve; f32 and f64, batched,
#                  ill-conditioned) exported by jax and run by pjrt on the CUDA plugin with
#                  the kernel wheel's cuSOLVER/cuSPARSE handlers, judged against numpy
#   gpu-client     xla_client.make_gpu_client with a GpuAllocatorConfig (BFC at 0.5 and
#                  0.25 of the memory: bytes_limit follows), a program run on each
#   pytest-gpu     the gpu-marked tests (pytest -m gpu)
#   bench          benchmarks/bench_gpu.py: pjrt next to jax on the first GPU (per-call cost,
#                  transfers from pageable and pinned memory, a streamed upload, an MLP
#                  training step); its table goes into the report with the card's name
#
#   bash scripts/gpu-check.sh [REPORT]
#
# REPORT defaults to $OUT/gpu-check-report.txt when OUT is set, else gpu-check-report.txt
# here. Without an NVIDIA GPU it says so and exits 0 at once. It uses the CUDA plugin wheel
# installed on the machine (jax-cuda13-pjrt, else jax-cuda12-pjrt) whatever its release, and
# needs no network. The whole run stays under 590 s: gpu-check.py gets what is left of 585 s
# after the GPU count here, and its steps together 25 s less (its --budget), which leaves time
# to write the report when a step runs to its limit. The behaviour steps keep their own limits
# and run first; bench runs last in what they left (the full run needs 180 s, its --quick form
# 90 s) and is skipped, saying so, when less is left. Exit status 1 when a step failed.
set -uo pipefail
cd "$(dirname "$0")/.."

report=${1:-}
if [ -z "$report" ]; then
  if [ -n "${OUT:-}" ]; then report=$OUT/gpu-check-report.txt; else report=gpu-check-report.txt; fi
fi
python=${PYTHON:-python3}

gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(timeout 30 nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
elif compgen -G '/dev/nvidia[0-9]*' >/dev/null; then
  gpus=$(compgen -G '/dev/nvidia[0-9]*' | wc -l)
fi
if [ "${gpus:-0}" -eq 0 ]; then
  message="no NVIDIA GPU here (nvidia-smi lists none, or no /dev/nvidiaN): nothing to check"
  mkdir -p "$(dirname "$report")"
  echo "$message" >"$report"
  echo "$message"
  exit 0
fi

echo "$gpus NVIDIA GPU(s); report: $report"
left=$((585 - SECONDS))
exec timeout "$left" "$python" scripts/gpu-check.py --report "$report" --budget "$((left - 25))" \
  --wheels "${GPU_CHECK_WHEELS:-.gpu-check}" --site "${GPU_CHECK_SITE:-/tmp/pjrt-site}"
