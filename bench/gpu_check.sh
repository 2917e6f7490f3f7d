#!/usr/bin/env bash
# The prepared GPU check (shared BENCHMARKS.md): one script, minutes not hours, all output
# kept in ${OUT:-bench/results}/gpu_check.log. What it covers today: the machine report,
# the measured profile, the CUDA runtime path (resident and streamed weights on cuda:0,
# checked against eager), the CPU benches for reference, and hf_offload with the budget on
# cuda:0 (GPU eager, CPU eager, Accelerate, TensorTorrent; its JSON is hf_offload_cuda.json).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/results}"
mkdir -p "$out"
{
  nvidia-smi || true
  python3 -m pip install --quiet -e ".[dev]"
  tensortorrent doctor
  tensortorrent validate-hardware --quick --output "$out/gpu_profile.json"
  python3 - <<'PY'
import torch
import tensortorrent as tt
from tests.models import mlp

model, x = mlp(2048, 8), torch.randn(64, 2048)
size = sum(p.numel() * p.element_size() for p in model.parameters())
for fraction in (4.0, 0.5):
    torch._dynamo.reset()
    budget = int(size * fraction)
    compiled = tt.compile(model, example_inputs=(x,), budgets={"cuda:0": budget},
                          devices=["cuda:0"], compiler="eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-3, atol=1e-3)
    print(compiled.explain())
    print(f"cuda:0 budget {budget} bytes: outputs match eager")
PY
  python3 -m bench.planner
  python3 -m bench.fit --quick
  if python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    python3 -m bench.hf_offload --device cuda:0 --repeats 3 --timeout 300 --results "$out"
  fi
} 2>&1 | tee "$out/gpu_check.log"
