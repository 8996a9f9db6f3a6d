# mk/nixl.mk -- the NIXL transport's two-process tests (tests/nixl/), part of `make test`.
#   make test-nixl   build/venv-nixl with the nixl-cu12 wheel from PyPI (--no-deps: the wheel
#                    declares torch but its C API needs nothing of it), then the tests over
#                    NIXL/UCX on host memory, twice: with UCX's own transport choice (cma on
#                    one host: READs complete inside the post) and with UCX_TLS=tcp (READs
#                    in flight, so a sender killed mid-READ is really exercised)
#                    -> $(RESULTS)/nixl.counts. NIXL_UCX_TLS= overrides the second list.
#   make nixl-check  (not part of `make test`) the same tests built against the ASan+UBSan
#                    library of `make check`, leak detection on, UCX's own transports.
#   make nixl-vram-check  build/nixl_vram_check (part of `make` where CUDA is found): the
#                    VRAM READs that scripts/gpu-check.sh runs on a GPU (exit 3 without one).
# When PyPI cannot be reached the suite records one skip and says so; a wheel that installs
# but does not load fails the suite (TANDEM_NIXL_REQUIRED=1).

NIXL_VENV ?= $(BUILD)/venv-nixl
NIXL_PKG  ?= nixl-cu12
NIXL_TEST := $(BUILD)/tests-nixl/test_kvx_nixl
NIXL_UCX_TLS ?= tcp
NIXL_SITE  = $(shell $(NIXL_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null)

.PHONY: test-nixl nixl-check

# The test double of libnixl_capi that tests/unit/kvx/test_kvx_nixl_fake.c loads (part of
# `make tests`, so the transport's code runs in test-c and under `make check` without NIXL).
NIXL_FAKE := $(BUILD)/tests-nixl/fake/libnixl_capi.so.0

$(NIXL_FAKE): tests/nixl/fake_nixl_capi.c
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) $(WARN) -Wno-missing-prototypes $(CFLAGS) $(EXTRA_CFLAGS) -fPIC -shared -fvisibility=hidden \
	  -o $@ $< -lpthread

tests: $(NIXL_FAKE)

TEST_SUITES += test-nixl

$(NIXL_TEST): tests/nixl/test_kvx_nixl.c tests/unit/kvx/kvx_testutil.h $(LIB_A) $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -Itests/unit/kvx $(ALL_CFLAGS) $(CMOCKA_CFLAGS) -o $@ $< $(LIB_A) $(CMOCKA_LIBS) $(LINK_LIBS)

# .ok: the wheel is installed; .unreachable: PyPI could not be reached (the log says why).
$(NIXL_VENV)/.state:
	@mkdir -p $(dir $@)
	@test -x $(NIXL_VENV)/bin/python || $(PYTHON3) -m venv $(NIXL_VENV)
	@if $(NIXL_VENV)/bin/python -c 'import importlib.metadata as m; m.version("$(NIXL_PKG)")' 2>/dev/null; then \
	  echo ok > $@; \
	else \
	  echo "nixl: installing $(NIXL_PKG) (--no-deps) into $(NIXL_VENV) from PyPI"; \
	  if $(NIXL_VENV)/bin/pip install -q --disable-pip-version-check --no-deps $(NIXL_PKG) \
	       >$(NIXL_VENV)/pip-install.log 2>&1; then echo ok > $@; \
	  else echo unreachable > $@; fi; \
	fi

test-nixl: $(NIXL_TEST) $(NIXL_VENV)/.state
	@mkdir -p $(RESULTS)
	@if [ "$$(cat $(NIXL_VENV)/.state)" != ok ]; then \
	  echo "nixl: SKIPPED: pip could not install $(NIXL_PKG) (PyPI unreachable?):"; \
	  tail -n 2 $(NIXL_VENV)/pip-install.log; rm -f $(NIXL_VENV)/.state; \
	  echo "0 0 1" > $(RESULTS)/nixl.counts; exit 0; fi; \
	echo "nixl: UCX_TLS=$${UCX_TLS:-(UCX default)}"; \
	TANDEM_NIXL_DIR=$(NIXL_SITE) TANDEM_NIXL_REQUIRED=1 \
	  scripts/run-tests $(RESULTS)/nixl-default.counts $(NIXL_TEST); rc=$$?; \
	echo "nixl: UCX_TLS=$(NIXL_UCX_TLS)"; \
	UCX_TLS=$(NIXL_UCX_TLS) TANDEM_NIXL_DIR=$(NIXL_SITE) TANDEM_NIXL_REQUIRED=1 \
	  scripts/run-tests $(RESULTS)/nixl-tls.counts $(NIXL_TEST) || rc=1; \
	cat $(RESULTS)/nixl-default.counts $(RESULTS)/nixl-tls.counts | \
	  awk '{p+=$$1; f+=$$2; s+=$$3} END {print p, f, s}' > $(RESULTS)/nixl.counts; exit $$rc

nixl-check: $(NIXL_VENV)/.state
	@if [ "$$(cat $(NIXL_VENV)/.state)" != ok ]; then echo "nixl-check: SKIPPED: $(NIXL_PKG) not installed"; \
	  rm -f $(NIXL_VENV)/.state; exit 0; fi; \
	$(SAN_MAKE) $(BUILD)/san/tests-nixl/test_kvx_nixl && \
	$(SAN_ENV) TANDEM_NIXL_DIR=$(NIXL_SITE) TANDEM_NIXL_REQUIRED=1 $(BUILD)/san/tests-nixl/test_kvx_nixl

# The GPU half (VRAM registration, direct and staged READs between two processes): built by
# `make` where CUDA is found, run by scripts/gpu-check.sh when a GPU is present.
NIXL_VRAM_CHECK := $(BUILD)/nixl_vram_check
.PHONY: nixl-vram-check
nixl-vram-check: $(NIXL_VRAM_CHECK)
ifeq ($(HAVE_CUDA),1)
all: $(NIXL_VRAM_CHECK)
endif

$(NIXL_VRAM_CHECK): tests/nixl/nixl_vram_check.c $(BUILD)/libtandem.so $(HEADERS)
	$(CC) $(CPPFLAGS) $(ALL_CFLAGS) -o $@ $< -L$(BUILD) -ltandem -Wl,-rpath,'$$ORIGIN'
