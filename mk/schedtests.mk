# mk/schedtests.mk -- build rules for the scheduler tests (tests/unit/sched/) and the
# scheduler benchmark (bench/sched_bench.c, with the allocation counter of bench/common/).
#
# TDM_HAVE_SCHED_IMPL tells the test and benchmark sources whether sched/ has its
# implementation yet: without it they compile to a binary that reports one skipped test
# (so that `make test` stays green while the scheduler is being written).
# The policy plug-in used by test_sched_policy (tests/unit/sched/plugin_sjf.c) is built
# as $(BUILD)/tests/sched/plugin_sjf.so; the test finds it through $TANDEM_BUILD.

SCHED_IMPL_SRCS := $(wildcard sched/*.c)
SCHED_HAVE_IMPL := $(if $(SCHED_IMPL_SRCS),1,0)

$(BUILD)/tests/sched/%: CPPFLAGS += -DTDM_HAVE_SCHED_IMPL=$(SCHED_HAVE_IMPL)
$(BUILD)/bench/sched_bench: CPPFLAGS += -DTDM_HAVE_SCHED_IMPL=$(SCHED_HAVE_IMPL)

SCHED_PLUGIN_SO := $(BUILD)/tests/sched/plugin_sjf.so

$(SCHED_PLUGIN_SO): tests/unit/sched/plugin_sjf.c include/tandem.h
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) $(WARN) -O1 -g -shared -fPIC -Iinclude -o $@ $<

tests: $(SCHED_PLUGIN_SO)
$(BUILD)/tests/sched/test_sched_policy: $(SCHED_PLUGIN_SO)

# The benchmark counts libc allocations (steady_allocs) with the malloc interposer of
# bench/common/alloc_count.c, linked into it alone (never into the library), and drives the
# library through the host of bench/common/bench_host.c (shared with bench/ir/sched_ir.c).
BENCH_HOST        := bench/common/bench_host.c bench/common/bench_host.h
BENCH_ALLOC_COUNT := bench/common/alloc_count.c bench/common/alloc_count.h
$(BUILD)/bench/sched_bench: bench/sched_bench.c $(BENCH_ALLOC_COUNT) $(BENCH_HOST) $(LIB_A) $(SIM_A) $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -Isim $(ALL_CFLAGS) -o $@ $< bench/common/alloc_count.c bench/common/bench_host.c \
	  $(SIM_A) $(LIB_A) $(LINK_LIBS)
