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
