#!/usr/bin/env bash
# One prepared GPU check (see shared BENCHMARKS.md): install, report the machine,
# run the test suite's CUDA-relevant parts and the demo. Prints everything; writes
# the log under ${OUT:-bench/results}.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/results}"
mkdir -p "$out"
{
  nvidia-smi || true
  python3 -m pip install --quiet -e ".[dev]"
  tensortorrent doctor
  tensortorrent demo
} 2>&1 | tee "$out/gpu_check.log"
