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

# test_kvx_proc forks, which ThreadSanitizer's own threads do not survive: it is left out.
KVX_TSAN_BINS = $(patsubst $(BUILD)/%,$(BUILD)/tsan/%,$(filter-out %/test_kvx_proc,$(filter $(BUILD)/tests/kvx/%,$(TEST_BINS))))

kvx-tsan:
	@$(MAKE) --no-print-directory BUILD=$(BUILD)/tsan HAVE_CUDA=0 O=1 \
	  EXTRA_CFLAGS="-fsanitize=thread" EXTRA_LDFLAGS="-fsanitize=thread" \
	  $(KVX_TSAN_BINS)
	@set -e; for t in $(KVX_TSAN_BINS); do \
	  TSAN_OPTIONS="halt_on_error=1 suppressions=$(abspath tests/unit/kvx/tsan.supp)" $$t; done
