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

.PHONY: install demo test ui lint clean-venv

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(PIP) install --progress-bar off -q --upgrade pip
	$(PIP) install --progress-bar off -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .

# End-to-end demo of what exists so far, all measured for real: build the small
# default model (cached), profile every supported mode on every workload family
# (--quick), label each measured request with the oracle, build a training table
# and train the four learned routers (a few Optuna trials, tracked in mlruns/),
# and route a drawn request population with the rule baseline. When the study's published A100
# profiles are present (SHARED=...), they are imported and labelled too.
demo: $(STAMP)
	@mkdir -p $(RUN_DIR)
	$(BIN)/modeswitch model build
	$(BIN)/modeswitch profile --quick -o $(RUN_DIR)/profiles.parquet
	$(BIN)/modeswitch label --profiles $(RUN_DIR)/profiles.parquet -o $(RUN_DIR)/labels.parquet
	$(BIN)/modeswitch dataset build --profiles $(RUN_DIR)/profiles.parquet --requests 700 \
		-o $(RUN_DIR)/train.parquet
	$(BIN)/modeswitch train --data $(RUN_DIR)/train.parquet --trials 5
	$(BIN)/modeswitch requests -n 20 -o $(RUN_DIR)/requests.jsonl
	$(BIN)/modeswitch label --profiles $(RUN_DIR)/profiles.parquet --requests $(RUN_DIR)/requests.jsonl \
		-o $(RUN_DIR)/request_labels.parquet
	$(BIN)/modeswitch route --requests $(RUN_DIR)/requests.jsonl --router rule \
		--available-modes "$$($(BIN)/python -c 'from engine.backends.transformers_backend import capabilities; print(",".join(capabilities().supported_modes()))')"
	@if [ -d $(SHARED) ]; then \
		$(BIN)/modeswitch import-profiles $(SHARED)/profiles_a100_curated_sweep_trials.csv \
			$(SHARED)/profiles_a100_curated_sweep.csv -o $(RUN_DIR)/a100.parquet && \
		$(BIN)/modeswitch label --profiles $(RUN_DIR)/a100.parquet --explain -o $(RUN_DIR)/a100_labels.parquet; \
	else echo "published A100 profiles not found at $(SHARED): skipping their import"; fi
	@echo "demo outputs in $(RUN_DIR)"

# MLflow UI over the project's store, bound to loopback.
ui: $(STAMP)
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false $(BIN)/mlflow ui \
		--backend-store-uri sqlite:///mlruns/mlflow.db \
		--default-artifact-root mlruns/artifacts \
		--host 127.0.0.1 --port 5000 --workers 1

clean-venv:
	rm -rf $(VENV)
