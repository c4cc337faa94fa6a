#!/usr/bin/env bash
# GPU readiness check: profile the reference and two modes on an NVIDIA GPU with the
# transformers backend and the NVML energy meter, then print the profile summary.
#
#   bash scripts/gpu_check.sh [MODEL]        # MODEL: 'tiny' (default) or a local HF checkpoint
#
# Needs: an NVIDIA driver (nvidia-smi), Python >= 3.11. Creates .venv-gpu with the
# project and its `gpu` extra (nvidia-ml-py; vllm is not needed for this check).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="${1:-tiny}"
OUT="runs/gpu-check-$(date +%Y%m%d-%H%M%S)"
command -v nvidia-smi >/dev/null || { echo "no nvidia-smi: this check needs an NVIDIA GPU" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [ ! -x .venv-gpu/bin/modeswitch ]; then
  python3 -m venv .venv-gpu
  # the CUDA build of torch comes from PyPI here (no CPU wheel pin on a GPU machine)
  .venv-gpu/bin/pip install -q --disable-pip-version-check torch
  .venv-gpu/bin/pip install -q --disable-pip-version-check --no-deps -e .
  .venv-gpu/bin/pip install -q --disable-pip-version-check numpy pandas pyarrow pandera \
    scikit-learn transformers typer rich matplotlib psutil rouge-score pydantic nvidia-ml-py
fi
.venv-gpu/bin/python - <<'PY'
import torch, pynvml
assert torch.cuda.is_available(), "torch sees no CUDA device"
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
try:
    print("NVML total-energy counter:", pynvml.nvmlDeviceGetTotalEnergyConsumption(h), "mJ")
except pynvml.NVMLError as e:
    print("NVML total-energy counter unavailable (", e, "): power polling will be used")
PY
mkdir -p "$OUT"
.venv-gpu/bin/modeswitch profile --device cuda --model "$MODEL" \
  --modes fp16_baseline,prefix_caching,chunked_prefill \
  --workloads short_prompt_long_output,shared_prefix_chat,long_prompt_short_output \
  --requests 2 -o "$OUT/profiles.parquet"
.venv-gpu/bin/python - "$OUT/profiles.parquet" <<'PY'
import sys
import pandas as pd
df = pd.read_parquet(sys.argv[1])
cols = ["latency_ms", "ttft_ms", "tokens_per_s", "energy_per_token_j", "peak_memory_mb"]
print(df.groupby(["family", "mode"])[cols].median().round(3).to_string())
print("energy source:", ", ".join(df["energy_source"].unique()), "| hardware:", df["hardware"].iloc[0])
PY
echo "profile: $OUT/profiles.parquet"
