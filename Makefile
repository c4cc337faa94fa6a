# Two commands for a fresh machine: `make demo` (the main job) and `make test`.
# Each creates .venv and installs what it needs by itself.

PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
SHARED  ?= ../shared/reference/a100
RUN_DIR ?= runs/demo-$(shell date +%Y%m%d-%H%M%S)
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

# End-to-end demo of what exists so far: import the study's published A100
# profiles, label every workload with the oracle (with reasons), then route a
# drawn request population with the rule baseline and label it by estimation.
demo: $(STAMP)
	@test -d $(SHARED) || { echo "demo: published profiles not found at $(SHARED); set SHARED=path/to/reference/a100"; exit 2; }
	@mkdir -p $(RUN_DIR)
	$(BIN)/modeswitch modes
	$(BIN)/modeswitch import-profiles $(SHARED)/profiles_a100_curated_sweep_trials.csv \
		$(SHARED)/profiles_a100_curated_sweep.csv -o $(RUN_DIR)/a100.parquet
	$(BIN)/modeswitch label --profiles $(RUN_DIR)/a100.parquet --explain -o $(RUN_DIR)/labels.parquet
	$(BIN)/modeswitch requests -n 20 -o $(RUN_DIR)/requests.jsonl
	$(BIN)/modeswitch route --requests $(RUN_DIR)/requests.jsonl --router rule
	$(BIN)/modeswitch label --profiles $(RUN_DIR)/a100.parquet --requests $(RUN_DIR)/requests.jsonl \
		-o $(RUN_DIR)/request_labels.parquet
	@echo "demo outputs in $(RUN_DIR)"

# MLflow UI over the project's store, bound to loopback.
ui: $(STAMP)
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false $(BIN)/mlflow ui \
		--backend-store-uri sqlite:///mlruns/mlflow.db \
		--default-artifact-root mlruns/artifacts \
		--host 127.0.0.1 --port 5000 --workers 1

clean-venv:
	rm -rf $(VENV)
