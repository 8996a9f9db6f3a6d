# The simulator (sim/, tools/cmd_{sim,ab,sweep,cost,demo}.c): `make run` compares the
# vLLM-default-like config with the stall-free decode-first config on the embedded chat
# workload and writes build/ab.png.
RUN_ARGS = ab configs/vllm-default.json configs/stall-free.json --plot $(BUILD)/ab.png

# The cost model's error against the measured tables in ../shared/profiles and the
# aiconfigurator tables (built first when pyarrow and the wheel can be had), on held-out rows.
.PHONY: calibrate
# The silicon check replays aiconfigurator's measured vLLM serving rows (silicon_sample.csv,
# read from the wheel `make tables` downloads into build/; never committed).
calibrate: all
	@$(MAKE) --no-print-directory tables || echo "calibrate: no converted tables (make tables failed); attention_mape needs them"
	@$(MAKE) --no-print-directory $(SILICON_CSV) || echo "calibrate: no silicon rows (the aiconfigurator-core wheel is missing)"
	$(TEST_ENV) $(TOOL) cost --calibrate --shared $(abspath ../shared) --tables $(TABLES_DIR) \
	    $$(test -f $(SILICON_CSV) && echo --silicon $(SILICON_CSV))

# The table cost model's tables (docs/cost_model.md): aiconfigurator's per-operator database
# (the aiconfigurator-core wheel, read with pyarrow in a build virtualenv) and Vidur's
# element-wise rows, converted into build/tables/<hw>/<op>.txt and build/tables/<hw>.json.
TABLES_DIR := $(BUILD)/tables
TABLES_ENV := $(BUILD)/tblenv
AC_VERSION := 0.12.0
.PHONY: tables
tables: $(TABLES_DIR)/.stamp
$(TABLES_DIR)/.stamp: scripts/make_tables.py
	@test -x $(TABLES_ENV)/bin/python || python3 -m venv $(TABLES_ENV)
	@$(TABLES_ENV)/bin/python -c 'import pyarrow' 2>/dev/null || $(TABLES_ENV)/bin/pip install -q pyarrow
	@ls $(BUILD)/acdl/aiconfigurator_core-$(AC_VERSION)-*.whl >/dev/null 2>&1 || \
	    $(TABLES_ENV)/bin/pip download -q --no-deps aiconfigurator-core==$(AC_VERSION) -d $(BUILD)/acdl
	$(TABLES_ENV)/bin/python scripts/make_tables.py --shared $(abspath ../shared) --out $(TABLES_DIR) \
	    --wheel $$(ls $(BUILD)/acdl/aiconfigurator_core-$(AC_VERSION)-*.whl | head -1)
	@touch $@

SILICON_CSV := $(BUILD)/silicon/silicon_sample.csv
$(SILICON_CSV): $(TABLES_DIR)/.stamp
	@mkdir -p $(dir $@)
	python3 -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); \
	    open(sys.argv[2], "wb").write(z.read("aiconfigurator_core/systems/silicon_sample.csv"))' \
	    $$(ls $(BUILD)/acdl/aiconfigurator_core-$(AC_VERSION)-*.whl | head -1) $@
