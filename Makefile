# Two commands on a fresh clone: `make demo` and `make test`. Both build .venv from scratch.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

.PHONY: demo test bench lint clean

$(VENV)/.installed: setup.py
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed setup.py
	$(PIP) install --quiet -e '.[test]'
	touch $@

demo: $(VENV)/.installed
	$(PY) -m experiments.demo

test: $(VENV)/.installed-test
	$(PY) -m pytest tests -q -n 2 --dist loadfile

bench: $(VENV)/.installed-test
	$(PY) -m experiments.bench.forward

clean:
	rm -rf $(VENV) .jax_cache .pytest_cache *.egg-info
