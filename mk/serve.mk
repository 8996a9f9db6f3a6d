# `tandem serve`'s C tests: tests/unit/serve/test_serve_conn.c (the connection table) and
# test_serve_pre.c (an add's prompt work on the decoding thread), run by
# make test and make check with every other tests/unit/*/test_*.c, and the fuzz harness
# tests/fuzz/fuzz_serve_msg.c compile tools/serve_*.c in directly (they live in tools/, not in
# the library), so they are rebuilt when those sources change.
$(BUILD)/tests/serve/test_serve_conn: tools/serve_conn.c
$(BUILD)/fuzz/fuzz_serve_msg_replay: $(wildcard tools/serve_*.c)
$(BUILD)/tests/serve/test_serve_pre: $(wildcard tools/serve_*.c)
