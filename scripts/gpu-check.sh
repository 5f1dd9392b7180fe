#!/usr/bin/env bash
# The GPU checks CI cannot run, as one script (budget: under 8 minutes on one node):
# the embedded engine on CUDA in bf16, an FSDP2 step on NCCL, and the NCCL weight-update
# group between two processes (needs two GPUs; skipped with a reason on one), and `rlvr plan`'s
# memory estimate (activations with and without checkpointing, the embedded KV cache) against
# torch.cuda.max_memory_allocated within 15% (tests/gpu/test_memory_estimate.py). Prints the
# GPU, each test's outcome and duration, and the numbers the tests print.
#
#   bash scripts/gpu-check.sh            # from the repository root, in the project's venv
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python - <<'PY'
import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s):",
      ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())) or "none")
PY
start=$(date +%s)
# tests/gpu/test_vllm_gpu.py runs vLLM with the NCCL group when RLVR_VLLM_PYTHON names a vLLM env with CUDA.
timeout 470 python -m pytest -m gpu tests/gpu -q -s -rA --durations=0 -p no:cacheprovider --timeout=400
echo "gpu-check: $(( $(date +%s) - start )) s"
