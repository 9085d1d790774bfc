# The commands of README.md (`make lab` opens the lessons in JupyterLab). Both set everything up on a fresh machine: .venv, the package and its
# dev tools, and FashionMNIST from Debian's package dataset-fashion-mnist.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.miniai-installed
DATA := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
export MPLBACKEND ?= Agg

.PHONY: demo test data install bench lab

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	@touch $(STAMP)

data:
	@if [ -n "$$MINIAI_DATA" ] || [ -f $(DATA) ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "Installing FashionMNIST (Debian package dataset-fashion-mnist)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null) \
	    || echo "apt-get could not install dataset-fashion-mnist"; \
	else \
	  echo "FashionMNIST is missing: run 'sudo apt-get install dataset-fashion-mnist', or set MINIAI_DATA to a folder with the four IDX .gz files (with network access the Hugging Face hub's copy is used)."; \
	fi

demo: install data
	@$(PY) -m miniai.loops   # numba compiles the kernel's loops once, into its disk cache (what `pip install` users run once)
	$(VENV)/bin/miniai-diagnose --epochs 1 --out miniai-diagnosis

test: install data
	$(VENV)/bin/nbdev-export
	@if [ -n "$$(git status --porcelain -- miniai)" ]; then \
	  echo "miniai/ differs from what the notebooks export: run nbdev-export and commit notebooks and modules together."; \
	  git status --short -- miniai; exit 1; fi
	@$(PY) -m miniai.loops   # numba compiles the kernel's loops once, into its disk cache (what `pip install` users run once)
	@start=$$(date +%s); HYPOTHESIS_PROFILE=make-test $(PY) -m pytest tests -q -n 2 --maxschedchunk 1 -p no:cacheprovider --durations=15; rc=$$?; \
	echo "make test: pytest took $$(( $$(date +%s) - start )) s"; exit $$rc

bench: install data
	@for f in bench/bench_*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

lab: install data
	cd nbs && env -u MPLBACKEND $(abspath $(VENV))/bin/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root) 10_activations.ipynb   # no Agg: figures inline
