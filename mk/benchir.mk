# mk/benchir.mk -- the scheduler's instruction-count benchmark (`make bench-ir`):
# bench/ir/sched_ir.c played under valgrind's callgrind by scripts/bench-ir, which prints
# instructions per step and per request-step of fixed scenarios and their ratio to
# bench/sched_ir.baseline (that file changes only in a commit of its own, with the reason).
# valgrind comes from Debian (scripts/bootstrap --bench installs it).
#   make bench-ir                      all scenarios against the baseline
#   make bench-ir IR_SCENARIOS=decode1024 IR_SAVE=/tmp/new.baseline

SCHED_IR     := $(BUILD)/bench/ir/sched_ir
IR_BASELINE  ?= bench/sched_ir.baseline
IR_SCENARIOS ?=
IR_SAVE      ?=

$(SCHED_IR): bench/ir/sched_ir.c bench/common/bench_host.c bench/common/bench_host.h $(LIB_A) $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(ALL_CFLAGS) -o $@ $< bench/common/bench_host.c $(LIB_A) $(LINK_LIBS)

benches: $(SCHED_IR)

.PHONY: bench-ir
bench-ir: $(SCHED_IR)
	@command -v valgrind >/dev/null || scripts/bootstrap --bench
	@scripts/bench-ir $(SCHED_IR) $(IR_BASELINE) $(if $(IR_SAVE),--save $(IR_SAVE)) $(IR_SCENARIOS)
