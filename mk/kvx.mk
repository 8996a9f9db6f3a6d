# mk/kvx.mk -- rules of the KV transfer engine (kv_transfer/).
#   make kvx-corpus   regenerate the seed corpus of tests/fuzz/fuzz_kvx_msg.c
#   make kvx-tsan     the kvx tests once under ThreadSanitizer

.PHONY: kvx-corpus kvx-tsan

$(BUILD)/fuzz/gen_kvx_msg_corpus: tests/fuzz/gen_kvx_msg_corpus.c $(LIB_A) $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(ALL_CFLAGS) -o $@ $< $(LIB_A) $(LINK_LIBS)

kvx-corpus: $(BUILD)/fuzz/gen_kvx_msg_corpus
	@mkdir -p tests/fuzz/corpus/kvx_msg
	$(BUILD)/fuzz/gen_kvx_msg_corpus tests/fuzz/corpus/kvx_msg

# test_kvx_proc and test_kvx_crash fork engines, which ThreadSanitizer's own threads do not
# survive: they are left out.
KVX_TSAN_BINS = $(patsubst $(BUILD)/%,$(BUILD)/tsan/%,$(filter-out %/test_kvx_proc %/test_kvx_crash,$(filter $(BUILD)/tests/kvx/%,$(TEST_BINS))))

kvx-tsan:
	@$(MAKE) --no-print-directory BUILD=$(BUILD)/tsan HAVE_CUDA=0 O=1 \
	  EXTRA_CFLAGS="-fsanitize=thread" EXTRA_LDFLAGS="-fsanitize=thread" \
	  $(KVX_TSAN_BINS)
	@set -e; for t in $(KVX_TSAN_BINS); do \
	  TSAN_OPTIONS="halt_on_error=1 suppressions=$(abspath tests/unit/kvx/tsan.supp)" $$t; done

# The pyzmq + msgpack client of docs/protocol.md against a real engine (skips without pyzmq).
KVX_PYSERVER := $(BUILD)/tests/kvx/kvx_pyserver

$(KVX_PYSERVER): tests/unit/kvx/py/kvx_pyserver.c $(LIB_A) $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(ALL_CFLAGS) -o $@ $< $(LIB_A) $(LINK_LIBS)

.PHONY: test-kvx-py
# Runs in the Python test virtualenv (mk/adapters.mk), which has pyzmq and msgpack.
test-kvx-py: $(KVX_PYSERVER) $(PY_VENV)/.deps-ok
	@mkdir -p $(RESULTS)
	@$(PY_VENV)/bin/python tests/unit/kvx/py/kvx_pyclient.py $(KVX_PYSERVER) $(RESULTS)/kvx-py.counts

TEST_SUITES += test-kvx-py
