# mk/dynamo.mk -- `make test-dynamo` (not part of `make test`): Tandem's KV events fed into
# Dynamo's own KV-router index (dynamo._core.RadixTree from the ai-dynamo-runtime wheel,
# the package that carries Dynamo's Rust core) in its own virtualenv, build/venv-dynamo.
# The full `ai-dynamo` package is not installed: one of its dependencies is a stub wheel
# that fetches from a package index this machine cannot reach. No GPU is needed.
# Results: $(RESULTS)/dynamo.log and dynamo.counts.

DYNAMO_VENV ?= $(BUILD)/venv-dynamo
DYNAMO_PKG  ?= ai-dynamo-runtime==1.6.1

.PHONY: test-dynamo

$(DYNAMO_VENV)/.deps-ok:
	@mkdir -p $(dir $@)
	@test -x $(DYNAMO_VENV)/bin/python || $(PYTHON3) -m venv $(DYNAMO_VENV)
	@if ! $(DYNAMO_VENV)/bin/python -c 'import dynamo._core, pytest' 2>/dev/null; then \
	  echo "dynamo: installing $(DYNAMO_PKG) pytest into $(DYNAMO_VENV); log: $(DYNAMO_VENV)/pip-install.log"; \
	  $(DYNAMO_VENV)/bin/pip install --disable-pip-version-check '$(DYNAMO_PKG)' pytest \
	    >$(DYNAMO_VENV)/pip-install.log 2>&1 || \
	    { echo "dynamo: 'pip install $(DYNAMO_PKG)' failed:" >&2; tail -n 5 $(DYNAMO_VENV)/pip-install.log >&2; exit 1; }; \
	fi
	@touch $@

test-dynamo: lib $(DYNAMO_VENV)/.deps-ok
	@mkdir -p $(RESULTS)
	@cd $(PY_PKG)/tests_dynamo && $(PY_ENV) PYTHONPATH=$(abspath $(PY_PKG)) \
	  $(abspath $(DYNAMO_VENV))/bin/python -m pytest -q -rs -p no:cacheprovider --color=no . \
	  > $(abspath $(RESULTS))/dynamo.log 2>&1; rc=$$?; \
	  cat $(abspath $(RESULTS))/dynamo.log; \
	  $(PYTEST_COUNTS) $(abspath $(RESULTS))/dynamo.log $$rc > $(abspath $(RESULTS))/dynamo.counts; \
	  cat $(abspath $(RESULTS))/dynamo.counts; [ $$rc -eq 0 ]
