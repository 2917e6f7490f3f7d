#!/usr/bin/env bash
# The prepared GPU check (shared BENCHMARKS.md): one script, minutes not hours, all output
# kept in ${OUT:-bench/results}/gpu_check.log. What it covers today: the machine report,
# the measured profile, the CUDA runtime path (weights resident on cuda:0, streamed from
# pinned host memory, and streamed from disk through pinned buffers, checked against eager;
# an activation spilled to pinned host memory and back), the CPU benches for reference, and
# hf_offload with the budget on
# cuda:0 (GPU eager, CPU eager, Accelerate, TensorTorrent; its JSON is hf_offload_cuda.json),
# and generate --quick the same way (a 35M-parameter Qwen3 generating 8 tokens, the budget on
# cuda:0 half its weights; generate_cuda.json).
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
import tempfile
import torch
import tensortorrent as tt
from tests.models import mlp

x = torch.randn(64, 2048)
size = sum(p.numel() * p.element_size() for p in mlp(2048, 8).parameters())
# resident, streamed from pinned host memory, and streamed from disk through pinned buffers
cases = {
    "resident": {"cuda:0": int(size * 4.0)},
    "streamed": {"cuda:0": int(size * 0.5)},
    "disk": {"cuda:0": int(size * 0.5), "cpu": int(size * 0.3)},
}
for case, budgets in cases.items():
    torch._dynamo.reset()
    model = mlp(2048, 8)
    with torch.no_grad():
        expected = model(x)
    compiled = tt.compile(model, example_inputs=(x,), budgets=budgets, devices=["cuda:0"],
                          compiler="eager", offload_dir=tempfile.mkdtemp())
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(compiled(x), expected, rtol=1e-3, atol=1e-3)
    print(compiled.explain())
    pinned = sum(p.is_pinned() for p in model.parameters())
    print(f"{case}: budgets {budgets}: outputs match eager; {pinned} parameters pinned; "
          f"{compiled.disk_bytes_read()} bytes read from disk in the last call; "
          f"cuda:0 peak allocated {torch.cuda.max_memory_allocated(0)} bytes")
    torch.cuda.reset_peak_memory_stats(0)

# activation spill: a long skip sent to pinned host memory and back (tests/integration/test_spill.py)
from tests.models import LongSkip
torch._dynamo.reset()
model, x = LongSkip(), torch.randn(512, 256)
compiled = tt.compile(model, example_inputs=(x,), budgets={"cuda:0": 6 * 2**20 + 3 * 2**18},
                      devices=["cuda:0"], compiler="eager")
with torch.no_grad():
    expected = model(x)
    for _ in range(3):
        torch.testing.assert_close(compiled(x), expected, rtol=1e-3, atol=1e-3)
(graph,) = compiled.graphs
print(compiled.explain())
print(f"spill: chose {graph.plan.native.chosen}, spilled {graph.plan.spilled_nodes()}; outputs "
      f"match eager; cuda:0 peak allocated {torch.cuda.max_memory_allocated(0)} bytes")
PY
  python3 -m bench.planner
  python3 -m bench.fit --quick
  if python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    python3 -m bench.hf_offload --device cuda:0 --rounds 1 --repeats 3 --timeout 300 --results "$out"
    python3 -m bench.generate --quick --device cuda:0 --timeout 300 --results "$out" || true
  fi
} 2>&1 | tee "$out/gpu_check.log"
