/*
 * sched_driver.h -- a scenario driver for scheduler tests: creates a configured scheduler,
 * adds requests with generated prompts, steps it, checks every batch it returns against the
 * documented contract (budget, sequence cap, offsets, block ids), fakes the model's sampled
 * tokens for an update, and checks the end-of-scenario invariant (every block free except
 * the null block, no refcount left, tdm__sched_check OK).
 *
 * The functions use cmocka assertions, so they may only be called from inside a cmocka test
 * (the including file must include <setjmp.h>, <stdarg.h>, <stddef.h> before <cmocka.h>;
 * this header does that itself).
 */
#ifndef TANDEM_TESTS_SCHED_DRIVER_H
#define TANDEM_TESTS_SCHED_DRIVER_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tandem.h"
#include "../../sched/sched_debug.h"

/* Create a scheduler and apply json (NULL: defaults). Fails the test on any error. */
tdm_sched *tsd_new(const char *json);

/* Create a scheduler and set parameters: kv holds key, value pairs ended by a 0 key, applied
 * in order with tdm_sched_set_param. Fails the test on any error. */
tdm_sched *tsd_newp(const int64_t *kv);

/* Check the internal invariants (tdm__sched_check) and fail the test with its message. */
void tsd_check(const tdm_sched *s);

/* The end-of-scenario check: no request left (num_unfinished 0, no held request), every
 * block free (free == total), no block in use, tdm__sched_check OK. */
void tsd_assert_clean(const tdm_sched *s);

/* tsd_assert_clean, then destroy. */
void tsd_done(tdm_sched *s);

/* Destroy a scheduler made by tsd_new/tsd_newp without checking it. */
void tsd_free(tdm_sched *s);

/* cmocka teardown: destroys the schedulers a failed test left behind (so that a failure does
 * not also show up as a leak under ASan). TSD_TEST(f) registers a test with it. */
int tsd_teardown(void **state);
#define TSD_TEST(f) cmocka_unit_test_teardown(f, tsd_teardown)

/* The generated prompt of request `id`: n tokens, distinct from every other id's prompt
 * (token i of id is 1000 + id * 7919 + i modulo a large prime, never EOS-like small ids). */
void tsd_prompt(uint64_t id, uint32_t n, tdm_token *out);

/* Initializes *d (tdm_request_desc_init) with id, prompt[0..n) and max_tokens; returns the
 * status of tdm_request_desc_init. No assertion: usable from any thread. */
int tsd_desc(tdm_request_desc *d, uint64_t id, const tdm_token *prompt, uint32_t n, uint32_t max_tokens);

/* Add a request with the generated prompt; returns the status of tdm_sched_add. */
int tsd_add(tdm_sched *s, uint64_t id, uint32_t num_prompt, uint32_t max_tokens);
/* Add a request with an explicit prompt. */
int tsd_add_tokens(tdm_sched *s, uint64_t id, const tdm_token *prompt, uint32_t n,
                   uint32_t max_tokens);
/* Add with a fully specified descriptor except id/prompt/max_tokens taken from the args. */
int tsd_add_desc(tdm_sched *s, tdm_request_desc *d);

/* A request descriptor that holds its own generated prompt (at most TSD_REQ_MAX_PROMPT
 * tokens). tsd_req_init sets id, the prompt tsd_prompt(id, n) and max_tokens (the other fields
 * as tdm_request_desc_init leaves them); the caller sets what else it needs in .d and adds it
 * with tdm_sched_add(s, &r.d). Do not copy one: .d.prompt points into it. */
#define TSD_REQ_MAX_PROMPT 256
typedef struct tsd_req {
    tdm_request_desc d;
    tdm_token prompt[TSD_REQ_MAX_PROMPT];
} tsd_req;
void tsd_req_init(tsd_req *r, uint64_t id, uint32_t n, uint32_t max_tokens);

/* The configured limits, read back with tdm_sched_get_param (for batch checks). */
typedef struct tsd_limits {
    int64_t budget, max_seqs, block_size, num_blocks, max_model_len, lookahead;
} tsd_limits;
void tsd_limits_get(const tdm_sched *s, tsd_limits *l);

/* Step at `now`; asserts TDM_OK and checks the batch: sums, offsets, budget, seq cap, ids
 * unique and known, block ids in range and nonzero, NEW/RESUMED entries carry the whole
 * block table. Also runs tsd_check. */
void tsd_step(tdm_sched *s, double now, tdm_batch *b);

/* Index of id among the batch entries, or -1. */
int tsd_find(const tdm_batch *b, uint64_t id);
/* Index of id in a plain id array, or -1. */
int tsd_find_id(const uint64_t *ids, uint32_t n, uint64_t id);

/* Fake the model's output for every entry of b that reached the end of its known tokens:
 * 1 + num_spec tokens (all drafts accepted) of value `tok` (drafts keep their own value if
 * accept_drafts is set... here every sampled token is `tok`). Entries whose request is gone
 * are skipped. Calls tdm_sched_update with now; r may be NULL. Asserts TDM_OK. */
void tsd_update(tdm_sched *s, const tdm_batch *b, tdm_token tok, double now,
                tdm_update_result *r);

/* Report m requests (ids, token offsets, tokens) as the batch of `step` with
 * tdm_sched_update_step, or per request with tdm_sched_update when step is 0. r may be NULL.
 * Returns the update status. */
int tsd_report_step(tdm_sched *s, uint64_t step, uint32_t m, const uint64_t *ids, const uint32_t *offs,
                    const tdm_token *toks, double now, tdm_update_result *r);

/* Report explicit sampled tokens for one request. Returns the update status. */
int tsd_update_one(tdm_sched *s, uint64_t id, const tdm_token *toks, uint32_t n, double now,
                   tdm_update_result *r);

/* Step and update until nothing is unfinished or max_steps passed; *now advances by 0.01 per
 * step. Returns the number of steps taken (fails the test if max_steps is exceeded). */
int tsd_run(tdm_sched *s, int max_steps, double *now);

/* Query helpers that fail the test on error. */
void tsd_info(const tdm_sched *s, uint64_t id, tdm_request_info *i);
uint32_t tsd_state(const tdm_sched *s, uint64_t id);
uint32_t tsd_unfinished(const tdm_sched *s);
void tsd_stats(const tdm_sched *s, tdm_sched_stats *st);

/* Assert that the request's token ids are prompt[0..np) then outs[0..no). */
void tsd_assert_tokens(const tdm_sched *s, uint64_t id, const tdm_token *prompt, uint32_t np,
                       const tdm_token *outs, uint32_t no);

/* Current configuration as a heap string (free with free()). */
char *tsd_config(const tdm_sched *s);

/* Look for `needle` in the scheduler's error message; fail the test with both otherwise. */
void tsd_assert_msg_has(const tdm_sched *s, const char *needle);

/* The main() of a scheduler test file while sched/ has no implementation yet
 * (TDM_HAVE_SCHED_IMPL is set to 0 by mk/schedtests.mk): one skipped test. */
#ifndef TDM_HAVE_SCHED_IMPL
#define TDM_HAVE_SCHED_IMPL 1
#endif
#define TSD_SKIP_MAIN(group)                                                              \
    static void sched_impl__absent(void **state)                                        \
    {                                                                                     \
        (void)state;                                                                      \
        print_message("scheduler implementation (sched/*.c) not present yet: skipped\n"); \
        skip();                                                                           \
    }                                                                                     \
    int main(void)                                                                        \
    {                                                                                     \
        const struct CMUnitTest t[] = { cmocka_unit_test(sched_impl__absent) };          \
        return cmocka_run_group_tests_name(group, t, NULL, NULL);                         \
    }

#endif
