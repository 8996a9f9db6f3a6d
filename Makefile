# Tandem -- scheduling and KV-transfer layer for LLM serving.
#
#   make            build/libtandem.so (+ versioned names), build/libtandem.a, build/tandem,
#                   and build/libtandem_cuda.so when nvcc is found (HAVE_CUDA=auto|0|1)
#   make test       bootstrap if needed, build, run every test suite
#   make check      the C tests under AddressSanitizer + UndefinedBehaviorSanitizer, and the
#                   fuzz corpora replayed
#   make bench      the benchmarks (each prints its figures and its in-run baseline)
#   make run        the main job: `tandem ab` on the embedded default workload
#   make install    PREFIX=/usr/local DESTDIR=  (header, libraries, tandem, tandem.pc)
#
# Sources are discovered by directory; module-specific rules live in mk/*.mk.

.DEFAULT_GOAL := all

# ---- toolchain and flags -----------------------------------------------------------------
CC         ?= cc
CXX        ?= c++
PKG_CONFIG ?= pkg-config
BUILD      ?= build
O          ?= 2
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)

VERSION_MAJOR := $(shell sed -n 's/^\#define TDM_VERSION_MAJOR \([0-9]*\)/\1/p' include/tandem.h)
VERSION_MINOR := $(shell sed -n 's/^\#define TDM_VERSION_MINOR \([0-9]*\)/\1/p' include/tandem.h)
VERSION_PATCH := $(shell sed -n 's/^\#define TDM_VERSION_PATCH \([0-9]*\)/\1/p' include/tandem.h)
ABI_VERSION   := $(shell sed -n 's/^\#define TDM_ABI_VERSION \([0-9]*\)/\1/p' include/tandem.h)
VERSION       := $(VERSION_MAJOR).$(VERSION_MINOR).$(VERSION_PATCH)

# msgpack-c >= 6 ships msgpack-c.pc; Debian 12's 4.x ships msgpack.pc.
MSGPACK_PC := $(shell $(PKG_CONFIG) --exists msgpack-c 2>/dev/null && echo msgpack-c || echo msgpack)
DEP_PKGS   := libzmq $(MSGPACK_PC) jansson libcrypto libxxhash
TEST_PKGS  := cmocka

# Only resolve package flags for goals that build something.
NOBUILD_GOALS := clean distclean help bootstrap
ifneq ($(filter-out $(NOBUILD_GOALS),$(or $(MAKECMDGOALS),all)),)
DEP_MISSING := $(foreach p,$(DEP_PKGS) $(TEST_PKGS),$(if $(shell $(PKG_CONFIG) --exists $(p) 2>/dev/null && echo y),,$(p)))
DEP_CFLAGS  := $(shell $(PKG_CONFIG) --cflags $(DEP_PKGS) 2>/dev/null)
DEP_LIBS    := $(shell $(PKG_CONFIG) --libs $(DEP_PKGS) 2>/dev/null)
CMOCKA_CFLAGS := $(shell $(PKG_CONFIG) --cflags cmocka 2>/dev/null)
CMOCKA_LIBS   := $(shell $(PKG_CONFIG) --libs cmocka 2>/dev/null)
endif

WARN     := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wpointer-arith \
            -Wformat=2 -Wno-unused-parameter
CSTD     := -std=c11 -D_GNU_SOURCE
CPPFLAGS += -Iinclude -Icommon
CFLAGS   ?= -O$(O) -g
LDLIBS_SYS := -ldl -lpthread -lm -lrt

ALL_CFLAGS = $(CSTD) $(WARN) $(CFLAGS) $(EXTRA_CFLAGS) $(DEP_CFLAGS)

# ---- CUDA (optional) ---------------------------------------------------------------------
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(shell command -v nvcc 2>/dev/null || { test -x $(CUDA_HOME)/bin/nvcc && echo $(CUDA_HOME)/bin/nvcc; })
HAVE_CUDA ?= auto
ifeq ($(HAVE_CUDA),auto)
  override HAVE_CUDA := $(if $(NVCC),1,0)
endif
NVCC_GENCODE ?= -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90,code=sm_90 \
                -gencode=arch=compute_90,code=compute_90
NVCCFLAGS ?= -O3 -std=c++17 $(NVCC_GENCODE) -Xcompiler -fPIC,-fvisibility=hidden,-Wall -Iinclude -Icommon
CUDA_LIBDIR ?= $(CUDA_HOME)/lib64

# ---- sources -----------------------------------------------------------------------------
LIB_SRCS   := $(sort $(wildcard common/*.c sched/*.c kv_transfer/*.c kernels/*.c))
CU_SRCS    := $(sort $(wildcard kernels/*.cu))
SIM_SRCS   := $(sort $(wildcard sim/*.c))
TOOL_SRCS  := $(sort $(wildcard tools/*.c))
TEST_SRCS  := $(sort $(wildcard tests/unit/*/test_*.c))
TESTLIB_SRCS := $(sort $(wildcard tests/common/*.c))
BENCH_SRCS := $(sort $(wildcard bench/*.c))
FUZZ_SRCS  := $(sort $(wildcard tests/fuzz/fuzz_*.c))
HEADERS    := $(wildcard include/*.h common/*.h sched/*.h kv_transfer/*.h kernels/*.h sim/*.h tools/*.h tests/common/*.h)

obj = $(patsubst %.c,$(2)/obj/%.o,$(1))

LIB_OBJS   := $(call obj,$(LIB_SRCS),$(BUILD))
SIM_OBJS   := $(call obj,$(SIM_SRCS),$(BUILD))
TOOL_OBJS  := $(call obj,$(TOOL_SRCS),$(BUILD))
TESTLIB_OBJS := $(call obj,$(TESTLIB_SRCS),$(BUILD))
CU_OBJS    := $(patsubst %.cu,$(BUILD)/obj/%.cu.o,$(CU_SRCS))

SONAME     := libtandem.so.$(ABI_VERSION)
LIB_SO     := $(BUILD)/libtandem.so.$(ABI_VERSION).$(VERSION_MINOR).$(VERSION_PATCH)
LIB_A      := $(BUILD)/libtandem.a
SIM_A      := $(BUILD)/libtandem_sim.a
TESTLIB_A  := $(BUILD)/libtandem_testutil.a
CUDA_SO    := $(BUILD)/libtandem_cuda.so
TOOL       := $(BUILD)/tandem
TEST_BINS  := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(TEST_SRCS))
BENCH_BINS := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRCS))
FUZZ_REPLAY_BINS := $(patsubst tests/fuzz/%.c,$(BUILD)/fuzz/%_replay,$(FUZZ_SRCS))

LINK_LIBS = $(DEP_LIBS) $(LDLIBS_SYS)

# ---- top-level targets -------------------------------------------------------------------
.PHONY: all lib tool cuda tests benches test test-c check bench run install uninstall clean \
        bootstrap deps help fuzz-replay

all: deps lib tool $(if $(and $(filter 1,$(HAVE_CUDA)),$(CU_SRCS)),cuda)

lib: $(BUILD)/libtandem.so $(LIB_A)
tool: $(TOOL)
cuda: $(CUDA_SO)
tests: $(TEST_BINS) $(FUZZ_REPLAY_BINS)
benches: $(BENCH_BINS)

help:
	@sed -n '3,12p' Makefile

bootstrap:
	scripts/bootstrap

# Fail early, naming the missing pkg-config module and the Debian package that has it.
deps:
	@if [ -n "$(strip $(DEP_MISSING))" ]; then \
	  echo "error: missing pkg-config modules: $(DEP_MISSING)" >&2; \
	  echo "       (Debian: libzmq3-dev libmsgpack-dev libjansson-dev libssl-dev libxxhash-dev libcmocka-dev; run scripts/bootstrap)" >&2; \
	  exit 1; fi

# ---- library -----------------------------------------------------------------------------
$(BUILD)/obj/%.o: %.c $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(ALL_CFLAGS) -fPIC -fvisibility=hidden \
	  -DTDM_HAVE_CUDA=$(HAVE_CUDA) -c $< -o $@

$(LIB_SO): $(LIB_OBJS) tandem.map
	$(CC) -shared -Wl,-soname,$(SONAME) -Wl,--version-script=tandem.map -Wl,-z,defs \
	  $(CFLAGS) $(EXTRA_LDFLAGS) -o $@ $(LIB_OBJS) $(LINK_LIBS)

$(BUILD)/libtandem.so: $(LIB_SO)
	ln -sf $(notdir $(LIB_SO)) $(BUILD)/$(SONAME)
	ln -sf $(SONAME) $@

$(LIB_A): $(LIB_OBJS)
	@rm -f $@
	$(AR) rcs $@ $^

# An archive; an empty one when a directory has no sources yet.
archive = @rm -f $@; mkdir -p $(dir $@); $(if $^,$(AR) rcs $@ $^,printf '!<arch>\n' > $@)

$(SIM_A): $(SIM_OBJS)
	$(archive)

$(TESTLIB_A): $(TESTLIB_OBJS)
	$(archive)

# The command line links the shared library as a host would (rpath to its own directory).
$(TOOL): $(TOOL_OBJS) $(SIM_A) $(BUILD)/libtandem.so
	$(CC) $(CFLAGS) $(EXTRA_LDFLAGS) -o $@ $(TOOL_OBJS) $(SIM_A) -L$(BUILD) -ltandem \
	  -Wl,-rpath,'$$ORIGIN' $(LINK_LIBS)

# ---- CUDA object (dlopen'ed by libtandem.so; never required) ------------------------------
$(BUILD)/obj/%.cu.o: %.cu $(HEADERS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(CUDA_SO): $(CU_OBJS)
	$(NVCC) -shared $(NVCC_GENCODE) -o $@ $^ -L$(CUDA_LIBDIR) -lcudart -lcublas

# ---- tests -------------------------------------------------------------------------------
# Tests link the static library so that they can reach internal (tdm__) hooks as well.
$(BUILD)/tests/%: tests/unit/%.c $(LIB_A) $(SIM_A) $(TESTLIB_A) $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -Itests/common -Isim $(ALL_CFLAGS) $(CMOCKA_CFLAGS) -o $@ $< \
	  $(TESTLIB_A) $(SIM_A) $(LIB_A) $(CMOCKA_LIBS) $(LINK_LIBS)

# Fuzz harnesses define LLVMFuzzerTestOneInput; the replay driver runs them over a corpus.
$(BUILD)/fuzz/%_replay: tests/fuzz/%.c tests/fuzz/replay_main.c $(LIB_A) $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(ALL_CFLAGS) -o $@ $< tests/fuzz/replay_main.c $(LIB_A) $(LINK_LIBS)

TEST_ENV = TANDEM_SHARED=$(abspath ../shared) TANDEM_BUILD=$(abspath $(BUILD))

RESULTS = $(BUILD)/test-results

# Runs every C test binary and replays the fuzz corpora; records the counts in $(RESULTS).
test-c: tests
	@$(TEST_ENV) scripts/run-tests $(RESULTS)/c.counts $(TEST_BINS) -- $(FUZZ_REPLAY_BINS)

# Extra suites (python, rust, ...) are appended to TEST_SUITES by mk/*.mk; each records
# "passed failed skipped" in $(RESULTS)/<suite>.counts. The summary prints the closing line.
TEST_SUITES := test-c

test:
	@scripts/bootstrap --check >/dev/null 2>&1 || scripts/bootstrap
	@$(MAKE) --no-print-directory -j$(JOBS) all tests
	@$(MAKE) --no-print-directory tables >/dev/null 2>&1 || \
	  echo "test: no converted cost tables (make tables failed: no PyPI?); the table calibration test skips"
	@$(MAKE) --no-print-directory $(SILICON_CSV) >/dev/null 2>&1 || \
	  echo "test: no silicon rows (the aiconfigurator-core wheel is missing); the silicon target test skips"
	@rm -rf $(RESULTS); mkdir -p $(RESULTS)
	@rc=0; $(MAKE) --no-print-directory -k $(TEST_SUITES) || rc=$$?; \
	  scripts/test-summary $(RESULTS) $(TEST_SUITES) || rc=1; exit $$rc

SAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
SAN_MAKE   = $(MAKE) --no-print-directory BUILD=$(BUILD)/san HAVE_CUDA=0 O=1 \
             EXTRA_CFLAGS="$(SAN_FLAGS)" EXTRA_LDFLAGS="-fsanitize=address,undefined"
SAN_ENV   := ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
             UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 TANDEM_SANITIZE=1

check:
	@scripts/bootstrap --check >/dev/null 2>&1 || scripts/bootstrap
	@$(SAN_MAKE) -j$(JOBS) all tests
	@rm -rf $(BUILD)/san/test-results; mkdir -p $(BUILD)/san/test-results
	@rc=0; $(SAN_ENV) $(SAN_MAKE) test-c || rc=$$?; \
	  scripts/test-summary $(BUILD)/san/test-results test-c || rc=1; exit $$rc

# ---- benchmarks --------------------------------------------------------------------------
$(BUILD)/bench/%: bench/%.c $(LIB_A) $(SIM_A) $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -Isim $(ALL_CFLAGS) -o $@ $< $(SIM_A) $(LIB_A) $(LINK_LIBS)

bench: all $(BENCH_BINS)
	@set -e; for b in $(BENCH_BINS); do echo "== $$b"; $(TEST_ENV) $$b; done

# ---- the main job --------------------------------------------------------------------------
RUN_ARGS ?= demo
run:
	@scripts/bootstrap --check >/dev/null 2>&1 || scripts/bootstrap
	@$(MAKE) --no-print-directory -j$(JOBS) all
	$(TEST_ENV) $(TOOL) $(RUN_ARGS)

# ---- install -----------------------------------------------------------------------------
prefix     ?= /usr/local
PREFIX     ?= $(prefix)
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
BINDIR     ?= $(PREFIX)/bin
PCDIR      ?= $(LIBDIR)/pkgconfig
INSTALL    ?= install

install: all
	$(INSTALL) -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(BINDIR) $(DESTDIR)$(PCDIR)
	$(INSTALL) -m 644 include/tandem.h include/tandem_kernels.h include/tandem_kvx.h $(DESTDIR)$(INCLUDEDIR)/
	$(INSTALL) -m 755 $(LIB_SO) $(DESTDIR)$(LIBDIR)/
	ln -sf $(notdir $(LIB_SO)) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libtandem.so
	$(INSTALL) -m 644 $(LIB_A) $(DESTDIR)$(LIBDIR)/
	if [ -f $(CUDA_SO) ]; then $(INSTALL) -m 755 $(CUDA_SO) $(DESTDIR)$(LIBDIR)/; fi
	$(INSTALL) -m 755 $(TOOL) $(DESTDIR)$(BINDIR)/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|' \
	    -e 's|@VERSION@|$(VERSION)|' -e 's|@MSGPACK@|$(MSGPACK_PC)|' tandem.pc.in > $(DESTDIR)$(PCDIR)/tandem.pc

uninstall:
	rm -f $(DESTDIR)$(LIBDIR)/libtandem.so* $(DESTDIR)$(LIBDIR)/libtandem.a \
	  $(DESTDIR)$(LIBDIR)/libtandem_cuda.so $(DESTDIR)$(BINDIR)/tandem $(DESTDIR)$(PCDIR)/tandem.pc \
	  $(DESTDIR)$(INCLUDEDIR)/tandem.h $(DESTDIR)$(INCLUDEDIR)/tandem_kernels.h $(DESTDIR)$(INCLUDEDIR)/tandem_kvx.h

clean:
	rm -rf $(BUILD)

-include $(sort $(wildcard mk/*.mk))
