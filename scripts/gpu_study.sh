#!/usr/bin/env bash
# The study on one NVIDIA GPU through vLLM, in one command, with one report.
#
#   scripts/gpu_study.sh [options] MODEL_DIR      run it (needs an NVIDIA GPU)
#   scripts/gpu_study.sh --plan MODEL_DIR         print what it would run; no GPU needed
#   scripts/gpu_study.sh --report OUT PROFILE...  only the report, from recorded profiles
#
# MODEL_DIR: a Hugging Face checkpoint folder (config.json), e.g. SmolLM2-135M-Instruct.
# Options: --draft DIR (a draft checkpoint: draft-model speculation), --checkpoint KEY=PATH
# (a pre-quantized checkpoint, KEY int8, gptq_4bit or awq_4bit; repeatable), --out DIR
# (default runs/gpu-study-DATE), --venv DIR (default .venv-gpu), --port N (default 8766).
#
# Steps: install `.[gpu]` (the tested vLLM) into the venv; check the GPU (nvidia-smi, NVML,
# free memory); make the quantized checkpoints not given (`modeswitch model quantize`); run
# the study (studies/gpu.toml: profile every mode vLLM runs on CUDA, label, train, score
# with a live run, its report); profile the quantized modes where checkpoints exist (the
# study's settings take none yet); export the best router, serve it with vLLM and ask it
# real questions; write OUT/README.md (scripts/gpu_study_report.py).
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "gpu_study.sh: $*" >&2; exit 2; }
usage="usage: scripts/gpu_study.sh [--plan] [--draft DIR] [--checkpoint KEY=PATH]... [--out DIR] MODEL_DIR | --report OUT PROFILE..."

PLAN=0 DRAFT="" OUT="runs/gpu-study-$(date +%Y%m%d-%H%M%S)" VENV=.venv-gpu PORT=8766
CHECKPOINTS=()
MODEL_DIR=""
while (( $# )); do
  case "$1" in
    --plan|--dry-run) PLAN=1 ;;
    --report)
      shift; (( $# >= 2 )) || die "--report needs OUT and at least one PROFILE ($usage)"
      py=${PY:-.venv/bin/python}; [ -x "$py" ] || py=$VENV/bin/python
      exec "$py" scripts/gpu_study_report.py "$@" ;;
    --draft) [ $# -ge 2 ] || die "--draft needs a folder"; DRAFT=$2; shift ;;
    --checkpoint) [ $# -ge 2 ] || die "--checkpoint needs KEY=PATH"; CHECKPOINTS+=("$2"); shift ;;
    --out) [ $# -ge 2 ] || die "--out needs a folder"; OUT=$2; shift ;;
    --venv) [ $# -ge 2 ] || die "--venv needs a folder"; VENV=$2; shift ;;
    --port) [ $# -ge 2 ] || die "--port needs a number"; PORT=$2; shift ;;
    -h|--help) echo "$usage"; exit 0 ;;
    -*) die "unknown option $1 ($usage)" ;;
    *) [ -z "$MODEL_DIR" ] || die "one MODEL_DIR only, got '$MODEL_DIR' and '$1'"; MODEL_DIR=$1 ;;
  esac
  shift
done
[ -n "$MODEL_DIR" ] || die "missing MODEL_DIR ($usage)"
[ -f "$MODEL_DIR/config.json" ] || die "MODEL_DIR '$MODEL_DIR' is not a model folder (no config.json)"
[ -z "$DRAFT" ] || [ -f "$DRAFT/config.json" ] || die "--draft '$DRAFT' is not a model folder (no config.json)"
[[ "$PORT" =~ ^[0-9]+$ ]] || die "--port '$PORT' is not a number"
for c in ${CHECKPOINTS[@]+"${CHECKPOINTS[@]}"}; do
  [[ "$c" =~ ^(int8|gptq_4bit|awq_4bit)=.+ ]] || die "--checkpoint '$c': expected KEY=PATH with KEY int8, gptq_4bit or awq_4bit"
  [ -f "${c#*=}/config.json" ] || die "--checkpoint '$c': no config.json in ${c#*=}"
done

MS="$VENV/bin/modeswitch"
PYV="$VENV/bin/python"
STEPS="$OUT/steps.tsv"

# note TEXT: what the next step does (printed in the plan too)
note() { echo "# $*"; }
# run NAME CMD...: print it; unless planning, run it, timed, its line added to steps.tsv
run() {
  local name=$1; shift
  echo "+ [$name] $*"
  (( PLAN )) && return 0
  local t0=$SECONDS rc=0
  "$@" || rc=$?
  printf '%s\t%s\t%s\n' "$name" "$((SECONDS - t0))" "$rc" >> "$STEPS"
  return "$rc"
}

(( PLAN )) && echo "plan (nothing is run): model $MODEL_DIR, output $OUT" || {
  mkdir -p "$OUT"; printf 'step\tseconds\texit status\n' > "$STEPS"; }

# 1. the project and the tested vLLM (pyproject's gpu extra pins it; CUDA torch from PyPI)
if [ ! -x "$MS" ] || (( PLAN )); then
  run venv python3 -m venv "$VENV"
  run install "$VENV/bin/pip" install --disable-pip-version-check -q -e '.[gpu]'
fi

# 2. the GPU: its name and memory, NVML's energy counter, and enough free memory for the
#    engines (the vLLM backend asks for 85 % of the device: gpu_memory_utilization)
gpu_check() {
  command -v nvidia-smi >/dev/null || { echo "no nvidia-smi: this study needs an NVIDIA GPU" >&2; return 2; }
  nvidia-smi --query-gpu=name,memory.total,memory.free,driver_version --format=csv | tee "$OUT/gpu.txt"
  "$PYV" - <<'PY' | tee -a "$OUT/gpu.txt"
import sys
import pynvml
import torch
import vllm
if not torch.cuda.is_available():
    sys.exit("torch sees no CUDA device")
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
mem = pynvml.nvmlDeviceGetMemoryInfo(h)
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), vllm {vllm.__version__}")
try:
    print("NVML total-energy counter:", pynvml.nvmlDeviceGetTotalEnergyConsumption(h), "mJ")
except pynvml.NVMLError as e:
    print(f"NVML total-energy counter unavailable ({e}): power polling is used")
print(f"free memory {mem.free / 2**30:.1f} of {mem.total / 2**30:.1f} GiB")
if mem.free < 0.9 * mem.total:
    sys.exit(f"only {mem.free / 2**30:.1f} of {mem.total / 2**30:.1f} GiB free: the engines ask for 85 %; "
             "stop what else runs on this GPU (nvidia-smi lists it)")
PY
}
note "check the GPU: nvidia-smi; torch sees CUDA; NVML's energy counter; at least 90 % of its memory free"
run gpu-check gpu_check

# 3. quantized checkpoints for the keys not given: `modeswitch model quantize` (llm-compressor
#    in its own environment: `make quantize` makes .venv-quantize, $MODESWITCH_QUANTIZE_PYTHON
#    names another); with none here, those modes are profiled only from --checkpoint
KEYS=()
for c in ${CHECKPOINTS[@]+"${CHECKPOINTS[@]}"}; do KEYS+=("${c%%=*}"); done
MISSING=()
for key in int8 gptq_4bit awq_4bit; do [[ " ${KEYS[*]-} " == *" $key "* ]] || MISSING+=("$key"); done
QPY="${MODESWITCH_QUANTIZE_PYTHON:-.venv-quantize/bin/python}"
if (( ${#MISSING[@]} )) && { [ -x "$QPY" ] || (( PLAN )); }; then
  args=(model quantize --model "$MODEL_DIR" --python "$QPY" --paths-json "$OUT/checkpoints.json")
  for key in "${MISSING[@]}"; do args+=(--checkpoint "$key"); done
  if run quantize "$MS" "${args[@]}"; then
    if (( PLAN )); then
      for key in "${MISSING[@]}"; do CHECKPOINTS+=("$key=<made by quantize>"); done
    else
      while read -r c; do CHECKPOINTS+=("$c"); done < <("$PYV" -c 'import json, sys
print("\n".join(f"{k}={v}" for k, v in json.load(open(sys.argv[1])).items()))' "$OUT/checkpoints.json")
    fi
  else
    echo "quantize failed: the modes of ${MISSING[*]} are not profiled (log above)"
  fi
elif (( ${#MISSING[@]} )); then
  echo "no quantize environment ($QPY; \`make quantize\` makes it): the modes of ${MISSING[*]} are" \
       "profiled only from --checkpoint KEY=PATH"
fi

# 4. the study: every mode vLLM runs on CUDA with this model (and draft), labels, routers,
#    offline and live scores, the study's report. Its file is studies/gpu.toml with the
#    model and the output folders set from the arguments (JSON's spelling of strings,
#    numbers and lists is TOML's; the study's loader checks the result).
CONFIG="$OUT/study.toml"
write_config() {
  "$( [ -x "$PYV" ] && echo "$PYV" || echo python3)" - studies/gpu.toml "$MODEL_DIR" "$DRAFT" "$OUT" <<'PY'
import json, sys, tomllib
src, model, draft, out = sys.argv[1:]
data = tomllib.load(open(src, "rb"))
data.setdefault("model", {})["model"] = model
if draft:
    data["model"]["draft_model"] = draft
data.setdefault("study", {}).update(output=f"{out}/study", mlruns=f"{out}/mlruns")
for table, values in data.items():
    print(f"[{table}]")
    for key, value in values.items():
        print(f"{key} = {json.dumps(value)}")
PY
}
note "the study's settings, $CONFIG:"
if (( PLAN )); then write_config | sed 's/^/#   /'; else write_config > "$CONFIG"; fi
run study "$MS" study run --config "$CONFIG"

# 5. the quantized modes (and their hybrids) beside the reference, where checkpoints exist
PROFILES=("$OUT/study/profile.parquet")
if (( ${#CHECKPOINTS[@]} )); then
  quant_modes() {
    "$PYV" - "${CHECKPOINTS[@]}" <<'PY'
import sys
from modeswitch.engine.modes import list_modes, reference_mode
keys = {c.split("=", 1)[0] for c in sys.argv[1:]}
print(",".join([reference_mode().name] + [m.name for m in list_modes() if m.quantization in keys]))
PY
  }
  families() {
    "$PYV" -c 'import sys, tomllib; print(",".join(tomllib.load(open(sys.argv[1], "rb"))["profile"]["families"]))' studies/gpu.toml
  }
  if (( PLAN )); then
    MODES="<the reference and every mode of the given checkpoints>" FAMILIES="<studies/gpu.toml's families>"
  else
    MODES=$(quant_modes) FAMILIES=$(families)
  fi
  args=(profile --backend vllm --device cuda --model "$MODEL_DIR" --modes "$MODES" --workloads "$FAMILIES"
        --requests 2 --trials 1 -o "$OUT/quantized.parquet")
  for c in "${CHECKPOINTS[@]}"; do args+=(--checkpoint "$c"); done
  run profile-quantized "$MS" "${args[@]}" && PROFILES+=("$OUT/quantized.parquet")
fi

# 6. the best router exported and served with vLLM; real questions through the openai client
serve_check() {
  "$MS" serve --backend vllm --device cuda --model "$MODEL_DIR" ${DRAFT:+--draft-model "$DRAFT"} \
    --mlruns "$OUT/mlruns" --port "$PORT" > "$OUT/serve.log" 2>&1 &
  local pid=$! rc=0
  "$PYV" scripts/demo_requests.py --url "http://127.0.0.1:$PORT/v1" > "$OUT/answers.txt" 2>&1 || rc=$?
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true
  cat "$OUT/answers.txt"
  return "$rc"
}
note "serve the exported router with vLLM on port $PORT; ask it scripts/demo_requests.py's questions"
run export "$MS" export --best oracle_match --mlruns "$OUT/mlruns"
run serve serve_check || echo "the served router failed: $OUT/serve.log"

# 7. one report
run report "$PYV" scripts/gpu_study_report.py "$OUT" "${PROFILES[@]}"
(( PLAN )) || echo "report: $OUT/README.md"
