# The simulator (sim/, tools/cmd_{sim,ab,sweep,cost,demo}.c): `make run` compares the
# vLLM-default-like config with the stall-free decode-first config on the embedded chat
# workload and writes build/ab.png.
RUN_ARGS = ab configs/vllm-default.json configs/stall-free.json --plot $(BUILD)/ab.png

# The cost model's error against the measured tables in ../shared/profiles.
.PHONY: calibrate
calibrate: all
	$(TEST_ENV) $(TOOL) cost --calibrate --shared $(abspath ../shared)
