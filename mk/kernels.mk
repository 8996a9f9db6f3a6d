# mk/kernels.mk -- rules of the kernels module (included by the Makefile).
#   make kv-check   build/kv_check: the CPU/GPU check and timing program that
#                   scripts/gpu-check.sh runs (CPU part runs anywhere: build/kv_check --cpu-only)
# `make tests` builds it too, so that it keeps compiling on machines without a GPU.

KV_CHECK := $(BUILD)/kv_check

.PHONY: kv-check
kv-check: $(KV_CHECK)

$(KV_CHECK): tests/unit/kernels/kv_check.c tests/unit/kernels/kv_test_util.h $(BUILD)/libtandem.so $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(ALL_CFLAGS) -o $@ $< -L$(BUILD) -ltandem -Wl,-rpath,'$$ORIGIN' \
	  $(EXTRA_LDFLAGS) $(LDLIBS_SYS)

tests: $(KV_CHECK)

# The CUDA kernel bodies compiled as C++ and run on the CPU against the CPU implementation
# (a suite of its own: it records its counts for the summary).
KERNEL_EMUL := $(BUILD)/tests/kernels/kernel_emul

$(KERNEL_EMUL): tests/unit/kernels/kernel_emul.cpp kernels/kv_kernels_dev.h $(LIB_A) $(HEADERS)
	@mkdir -p $(dir $@)
	$(CXX) -std=c++17 -O2 -g -Wall -Wextra -Wno-unknown-pragmas $(CPPFLAGS) -Ikernels \
	  $(EXTRA_CFLAGS) -o $@ $< $(LIB_A) $(EXTRA_LDFLAGS) $(LINK_LIBS)

tests: $(KERNEL_EMUL)

TEST_SUITES += test-kernels-emul
.PHONY: test-kernels-emul
test-kernels-emul: $(KERNEL_EMUL)
	@mkdir -p $(RESULTS)
	@$(KERNEL_EMUL) $(RESULTS)/kernels-emul.counts
