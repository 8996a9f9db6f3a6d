# mk/goodput.mk -- the goodput table of docs/simulator.md: configs/slo-adaptive.json against
# the static grid on the three real traces (scripts/goodput_table.sh; several minutes per
# trace, so not part of `make test`). GOODPUT_SET: colocated (default), disagg or 70b.
GOODPUT_SET ?= colocated
.PHONY: goodput-table
goodput-table: all
	@$(MAKE) --no-print-directory tables >/dev/null 2>&1 || \
	  echo "goodput-table: no converted cost tables (make tables failed); the roofline is used"
	SHARED=$(abspath ../shared) scripts/goodput_table.sh $(GOODPUT_SET)
