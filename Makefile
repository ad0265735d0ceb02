# Set-up and entry points. Every target installs into .venv first; torch==2.13.0 goes in
# before anything else so no dependency can pull a CUDA build of torch.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.qbench-installed

.PHONY: install demo test bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: install
	$(PY) -m qbench.demo.digits --out .
	$(PY) -m qbench.demo.qat_case --out .
	$(VENV)/bin/qbench sweep recipes/digits.yaml
	$(VENV)/bin/qbench gate recipes/digits.yaml || echo "(gate exit code $$?: 1 = a variant breached, 2 = results it could not judge; the lines above name which)"

test: install
	@# bytecode written once: the tests start hundreds of qbench processes, each of which would otherwise compile
	@# qbench's modules again where PYTHONDONTWRITEBYTECODE is set (0.35 s a process)
	$(PY) -m compileall -q qbench > /dev/null
	$(PY) -m pytest -q -p no:cacheprovider

bench: install
	$(PY) bench/overhead.py

clean:
	rm -rf $(VENV) reports/*/ recipes/reports models data mlflow.db mlflow.db.lock mlartifacts .qbench
