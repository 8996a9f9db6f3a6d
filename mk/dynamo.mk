# mk/dynamo.mk -- `make test-dynamo` (not part of `make test`): Tandem inside NVIDIA Dynamo's
# vLLM worker, proved with Dynamo's own code (adapters/python/tests_dynamo), no GPU:
# Tandem's KV events in Dynamo's radix tree, TandemScheduler's ForwardPassMetrics against
# Dynamo's InstrumentedScheduler, TandemScheduler through dynamo.vllm's argument parser and
# config builder, TandemConnector in Dynamo's disaggregated (NixlConnector) protocol,
# TandemInstrumentedScheduler through Dynamo's --benchmark-mode and set_fpm_worker_id.
#
# The virtualenv $(DYNAMO_VENV) is an overlay: a .pth file puts the site-packages of an
# installed vLLM environment on its path (DYNAMO_BASE_PYTHON, default $(VLLM_VENV)'s python,
# which `make test-vllm`'s rule installs), and pip installs into it, without dependencies,
# ai-dynamo and ai-dynamo-runtime (ai-dynamo's vllm extra would pull vllm[flashinfer,...]==0.31.0
# with a CUDA torch, gigabytes), $(DYNAMO_VLLM_PKG), the vLLM that ai-dynamo 1.6.1 pins
# (empty: keep the base's vLLM, e.g. when the base already is 0.31), and $(DYNAMO_DEPS). The
# base provides the rest of what dynamo.vllm imports (msgspec, pyzmq, pydantic, uvloop,
# transformers, aiohttp, prometheus_client, ...); a missing one is named and fails the
# target. When PyPI cannot be reached the target is skipped with a message (counts "0 0 1":
# pip reported a network error, or pip's index URL does not answer); any other install
# failure fails it.
#
#   make test-dynamo                                   (vLLM 0.31 over build/venv-vllm)
#   make test-dynamo DYNAMO_BASE_PYTHON=/path/venv-0.31/bin/python DYNAMO_VLLM_PKG=
#
# Results: $(RESULTS)/dynamo.log and dynamo.counts.

DYNAMO_VENV        ?= $(BUILD)/venv-dynamo
DYNAMO_VERSION     ?= 1.6.1
DYNAMO_PKGS        ?= ai-dynamo==$(DYNAMO_VERSION) ai-dynamo-runtime==$(DYNAMO_VERSION)
# pure-Python requirements of ai-dynamo that dynamo.vllm imports and a vLLM environment lacks
DYNAMO_DEPS        ?= redis>=6.2.0,<9.0.0
DYNAMO_VLLM_PKG    ?= vllm==0.31.0
DYNAMO_BASE_PYTHON ?= $(VLLM_VENV)/bin/python
# what the tests import from the overlay (checked after the install)
DYNAMO_IMPORTS     := dynamo._core, dynamo.llm, dynamo.vllm.args, dynamo.vllm.main, \
                      dynamo.vllm.handlers, dynamo.vllm.instrumented_scheduler, \
                      dynamo.vllm.kv_connector_protocols, dynamo.common.forward_pass_metrics, \
                      vllm, zmq, msgspec, pytest
DYNAMO_NET_ERR     := NewConnectionError|Failed to establish|Temporary failure in name resolution|Network is unreachable|No route to host|ConnectTimeout|ReadTimeout|ProxyError

.PHONY: test-dynamo

# $(VLLM_VENV) is built by its own rule only when the default base is used.
DYNAMO_BASE_DEP := $(if $(filter $(VLLM_VENV)/bin/python,$(DYNAMO_BASE_PYTHON)),$(VLLM_VENV)/.deps-ok)

$(DYNAMO_VENV)/.deps-ok: $(DYNAMO_BASE_DEP)
	@mkdir -p $(dir $@)
	@test -x $(DYNAMO_BASE_PYTHON) || { echo "dynamo: no base python $(DYNAMO_BASE_PYTHON)" >&2; exit 1; }
	@rm -f $(DYNAMO_VENV)/.skip
	@test -x $(DYNAMO_VENV)/bin/python || $(PYTHON3) -m venv $(DYNAMO_VENV)
	@sp=$$($(DYNAMO_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	  rm -rf $$sp/setuptools $$sp/setuptools-*.dist-info $$sp/pkg_resources $$sp/_distutils_hack \
	    $$sp/distutils-precedence.pth; \
	  $(DYNAMO_BASE_PYTHON) -c 'import sys; print("\n".join(p for p in sys.path if p.endswith("-packages")))' \
	    > $$sp/tandem-dynamo-base.pth
	@export VLLM_TARGET_DEVICE=cpu; py=$(DYNAMO_VENV)/bin/python; \
	if ! $$py -c 'import $(DYNAMO_IMPORT_LIST)' 2>/dev/null || \
	    { [ -n "$(DYNAMO_VLLM_PKG)" ] && ! $$py -c 'import sys, vllm; \
	      sys.exit(vllm.__version__ != "$(DYNAMO_VLLM_PKG)".split("==")[-1])' 2>/dev/null; }; then \
	  echo "dynamo: pip install --no-deps $(DYNAMO_PKGS) $(DYNAMO_VLLM_PKG) '$(DYNAMO_DEPS)' into $(DYNAMO_VENV); log: $(DYNAMO_VENV)/pip-install.log"; \
	  if ! $(DYNAMO_VENV)/bin/pip install --disable-pip-version-check --no-deps $(DYNAMO_PKGS) \
	       $(DYNAMO_VLLM_PKG) $(foreach d,$(DYNAMO_DEPS),'$(d)') >$(DYNAMO_VENV)/pip-install.log 2>&1; then \
	    idx=$${PIP_INDEX_URL:-$$($$py -c 'from pip._internal.models.index import PyPI; print(PyPI.simple_url)' 2>/dev/null)}; \
	    if grep -Eq '$(DYNAMO_NET_ERR)' $(DYNAMO_VENV)/pip-install.log || \
	       ! $$py -c 'import sys, urllib.request as u; u.urlopen(sys.argv[1], timeout=20)' "$$idx" 2>/dev/null; then \
	      echo "dynamo: PyPI unreachable ('pip install $(DYNAMO_PKGS)'); test-dynamo is skipped:" >&2; \
	      tail -n 3 $(DYNAMO_VENV)/pip-install.log >&2; touch $(DYNAMO_VENV)/.skip; exit 0; fi; \
	    echo "dynamo: 'pip install $(DYNAMO_PKGS) $(DYNAMO_VLLM_PKG)' failed:" >&2; \
	    tail -n 5 $(DYNAMO_VENV)/pip-install.log >&2; exit 1; \
	  fi; fi; \
	$$py -c 'import $(DYNAMO_IMPORT_LIST); import importlib.metadata as md, vllm, setuptools as s; \
	  assert int(s.__version__.split(".")[0]) >= 71, "setuptools %s shadows the base one" % s.__file__; \
	  print("dynamo: ai-dynamo", md.version("ai-dynamo"), "ai-dynamo-runtime", \
	        md.version("ai-dynamo-runtime"), "over vllm", vllm.__version__)' \
	  >$(DYNAMO_VENV)/check.log 2>&1 || { grep -v '^W[0-9]' $(DYNAMO_VENV)/check.log | tail -n 4 >&2; \
	    echo "dynamo: $(DYNAMO_VENV) cannot import what the tests need" >&2; exit 1; }; \
	grep '^dynamo:' $(DYNAMO_VENV)/check.log; touch $@

empty :=
space := $(empty) $(empty)
DYNAMO_IMPORT_LIST = $(subst $(space),,$(DYNAMO_IMPORTS))

test-dynamo: lib $(DYNAMO_VENV)/.deps-ok
	@mkdir -p $(RESULTS)
	@if [ -e $(DYNAMO_VENV)/.skip ]; then \
	  echo "dynamo: skipped (PyPI unreachable)" | tee $(RESULTS)/dynamo.log; echo "0 0 1" > $(RESULTS)/dynamo.counts; exit 0; fi; \
	cd $(PY_PKG)/tests_dynamo && $(PY_ENV) VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 \
	  PYTHONPATH=$(abspath $(PY_PKG)) \
	  $(abspath $(DYNAMO_VENV))/bin/python -m pytest -q -rs -p no:cacheprovider --color=no . \
	  > $(abspath $(RESULTS))/dynamo.log 2>&1; rc=$$?; \
	  grep -v '^W[0-9]' $(abspath $(RESULTS))/dynamo.log; \
	  $(PYTEST_COUNTS) $(abspath $(RESULTS))/dynamo.log $$rc > $(abspath $(RESULTS))/dynamo.counts; \
	  cat $(abspath $(RESULTS))/dynamo.counts; [ $$rc -eq 0 ]
