# ABI checks (scripts/check-abi): headers as C11 and C++, exported symbols, SONAME.
TEST_SUITES += test-abi
.PHONY: test-abi
test-abi: lib
	@scripts/check-abi $(BUILD) $(RESULTS)/abi.counts
