# verl-operator: the two set-up commands are `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
BENCH_STAMP := $(VENV)/.bench-stamp
PYTEST := $(BIN)/python -m pytest

.PHONY: venv demo test lint test-unit test-ray test-realverl test-cluster test-node test-fidelity verl-cpu-job verl-cpu-job-nodes bench crds settings clean

# The product (verl-operator, with the launcher) and its development tooling (tools/: verl-operator-dev),
# both editable.
$(STAMP): pyproject.toml tools/pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[launcher,test]' -e ./tools
	touch $@

venv: $(STAMP)

# The bench extra (matplotlib, for the scale benchmark's plots); `make test` never needs it.
$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[launcher,test,bench]' -e ./tools
	touch $@

demo: venv
	$(BIN)/verl-operator-dev demo

# Lint includes the docs check: every path, make target and CLI command README.md and docs/ name exists.
# lint-imports leaves out imports under `if TYPE_CHECKING:`; verl_devtools.import_cycles counts them.
lint: venv
	$(BIN)/ruff check operator launcher tools tests bench charts
	$(BIN)/ruff format --check operator launcher tools tests bench charts
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python -m verl_devtools.import_cycles operator/verl_operator launcher/verl_launcher launcher/verl_contract tools/verl_devtools
	$(PYTEST) -q tests/unit/test_docs_references.py

test-unit: venv
	$(PYTEST) tests/unit

test-ray: venv
	$(PYTEST) tests/ray

# verl 0.6.1's own trainer runs planned jobs through the launcher on a local two-node Ray, on CPU
# (docs/realverl.md). Its environment (PyPI's torch, about 3 GB) is built once into the cache.
test-realverl: venv
	$(BIN)/python tests/realverl/cpu_env.py
	$(PYTEST) tests/realverl

# Watch a verl step happen: one tiny job, the head's output as it comes (ALGORITHM=ppo for a critic).
ALGORITHM ?= grpo
verl-cpu-job: venv
	$(BIN)/python tests/realverl/run_job.py --algorithm $(ALGORITHM)

# The same job as a VerlJob on a devcluster with two real kubelet nodes: the operator's head and worker pods
# run verl's real trainer; the head pod's log as it comes, then the job's status (root; docs/realverl.md).
verl-cpu-job-nodes: venv
	$(BIN)/python tests/node/run_verl_cpu_job.py --algorithm $(ALGORITHM)

test-cluster: venv
	$(PYTEST) tests/cluster

# Real containers: two real kubelet nodes (Debian's containerd, runc, CNI plugins; installed with apt-get
# when missing) joined to the control plane, the operator installed by its chart. Needs root.
test-node: venv
	$(PYTEST) tests/node

test-fidelity: venv
	$(BIN)/python tests/fidelity/verl_envs.py
	$(PYTEST) tests/fidelity

# Every tier: pure logic, real local Ray, verl's real trainer on CPU, the real local control plane, real nodes,
# verl's own config code.
test: lint test-unit test-ray test-realverl test-cluster test-node test-fidelity

# The typed views of the settings registry (a unit test fails when they drift from the rows).
settings: venv
	$(BIN)/python -m verl_operator.api.settings_codegen planner > operator/verl_operator/planner/_settings_generated.py
	$(BIN)/python -m verl_operator.api.settings_codegen plan > operator/verl_operator/api/_plan_generated.py

# The CRD is generated from the pydantic models; the chart ships a copy (a unit test checks both).
crds: venv
	$(BIN)/verl-operator crd > crds/verl-operator.io_verljobs.yaml
	cp crds/verl-operator.io_verljobs.yaml charts/verl-operator/crds/verl-operator.io_verljobs.yaml

# Speed is measured here, not in tests; the numbers are recorded in docs/benchmarks.md.
# bench_scale.py builds KubeRay's operator once (cached) and runs both operators on a devcluster; pick sizes
# with SCALE_ARGS, e.g. `make bench SCALE_ARGS="--scenario 200x1000"`.
SCALE_ARGS ?=
bench: $(BENCH_STAMP)
	$(BIN)/python bench/bench_planner.py
	$(BIN)/python bench/bench_placement.py
	$(BIN)/python bench/bench_queue.py
	$(BIN)/python bench/bench_launcher.py
	$(BIN)/python bench/fuzz_admission.py
	$(BIN)/python bench/bench_key_suggestions.py
	$(BIN)/python bench/bench_admission_load.py
	$(BIN)/python bench/bench_scale.py $(SCALE_ARGS)

clean:
	-$(BIN)/verl-operator-dev devcluster down
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
