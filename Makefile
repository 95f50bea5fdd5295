# The two commands of the README: `make run` (install + dvc repro) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch==2.13.0 first: it is the CPU wheel on these machines; a bare `torch` pulls CUDA packages.
# Elsewhere, public PyPI's Linux wheel is a CUDA build: for a CPU one,
#   make run TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
TORCH ?= torch==2.13.0
# Which FAISS build: cpu (faiss-cpu) or gpu (faiss-gpu-cu12, CUDA 12), never both (pyproject.toml)
FAISS ?= cpu
# Every package at the version the suite last passed with and the committed reports were made with (`make lock`
# writes it); `make run CONSTRAINTS=` installs the newest versions pyproject.toml allows instead.
CONSTRAINTS ?= constraints.txt
PIN := $(if $(CONSTRAINTS),-c $(CONSTRAINTS))

.PHONY: run test test-optuna-min install install-test bench lock FORCE

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# What the venv was installed with. Its recipe runs every time but rewrites the file only when the settings differ,
# so `make run CONSTRAINTS=` or another TORCH installs again in a venv made otherwise, and a plain `make test` after
# them puts the pins back (the stamps below depend on the files alone, and took neither change for one).
INSTALL_SETTINGS := torch: $(TORCH); constraints: $(CONSTRAINTS); faiss: $(FAISS)
$(VENV)/.install-settings: FORCE
	@mkdir -p $(VENV)
	@echo '$(INSTALL_SETTINGS)' | cmp -s - $@ || echo '$(INSTALL_SETTINGS)' > $@

FORCE:

# One stamp per FAISS build, so `make run FAISS=gpu` in a venv made with cpu installs again; the other build goes
# first, as the two share the `faiss` package. torch goes in without the constraints: a TORCH with --index-url reads
# its dependencies from that index alone, which may lack the pinned versions; the next line sets them to the pins.
$(VENV)/.installed-$(FAISS): $(BIN)/python pyproject.toml $(CONSTRAINTS) $(VENV)/.install-settings
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip uninstall -q -y $(if $(filter gpu,$(FAISS)),faiss-cpu,faiss-gpu-cu12) 2>/dev/null || true
	$(BIN)/pip install -q $(PIN) -e ".[$(FAISS)]"
	rm -f $(VENV)/.installed-*
	touch $@

$(VENV)/.installed-test-$(FAISS): $(VENV)/.installed-$(FAISS)
	$(BIN)/pip install -q $(PIN) -e ".[$(FAISS),test]"
	touch $@

install: $(VENV)/.installed-$(FAISS)

install-test: $(VENV)/.installed-test-$(FAISS)

# check-inputs: a missing data.data_dir, said with its setting (dvc repro names only the path)
run: install
	$(BIN)/tqc check-inputs
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/dvc repro

# Two pytest-xdist processes: on 2 cores the suite took 0.70 of its serial time (11 min 52 s against 16 min 58 s).
# Three took 1.16 × two's time (12 min 59 s against 11 min 11 s, one run each on one machine, 2026-11-29).
test: install-test
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -q -n 2 -m "not slow and not gpu"

# pyproject allows optuna>=4.0, and before 4.9 Optuna names the heartbeat's callback otherwise
# (tqc.tuning.study._stale_trial_callback_keyword): the tuner's tests on the oldest Optuna allowed, laid over the venv's
# (its dependencies are the venv's), so that path is run, not assumed.
OPTUNA_MIN ?= 4.0.0
test-optuna-min: install-test
	$(BIN)/pip install -q --target .cache/optuna-$(OPTUNA_MIN) --no-deps optuna==$(OPTUNA_MIN)
	PYTHONPATH=.cache/optuna-$(OPTUNA_MIN) $(BIN)/python -c "import optuna; print('optuna', optuna.__version__)"
	PYTHONPATH=.cache/optuna-$(OPTUNA_MIN) PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -q -n 2 \
		-p no:cacheprovider tests/model/test_tune.py tests/flows/test_tune_flow.py tests/code/test_tracking.py

bench: install
	$(BIN)/tqc bench epochs --out reports/bench/epochs.json
	$(BIN)/tqc bench passes --batch-size 64 --steps 10 --out reports/bench/passes.json
	$(BIN)/tqc bench validate --dataset trec50 --out reports/bench/validate-trec50.json
	$(BIN)/tqc bench read --rows 500000 --out reports/bench/read.json
	$(BIN)/tqc bench serve --out reports/bench/serve.json

# constraints.txt anew: the newest versions pyproject.toml allows, resolved in a scratch venv (torch is $(TORCH), so
# it is left out, and so is pip; setuptools stays, which torch needs at run time and plain `pip freeze` omits). Then `make test` (and `dvc repro`, whose reports the versions make) before committing it.
LOCK_VENV := .cache/lock-venv
lock:
	rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install -q --upgrade pip
	$(LOCK_VENV)/bin/pip install -q $(TORCH)
	$(LOCK_VENV)/bin/pip install -q -e ".[cpu,test,server]"
	{ echo "# make lock's resolution of pyproject.toml (extras cpu, test, server) with $(TORCH); make run and make test"; \
	  echo "# install these versions (make run CONSTRAINTS= the newest allowed). Regenerate with make lock, then make test."; \
	  $(LOCK_VENV)/bin/pip freeze --all --exclude-editable | grep -v -i -E '^(torch|pip)=='; \
	} > constraints.txt.tmp
	mv constraints.txt.tmp constraints.txt
	rm -rf $(LOCK_VENV)
