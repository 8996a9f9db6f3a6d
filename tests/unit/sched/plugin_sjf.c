/*
 * plugin_sjf.c -- a tiny scheduling-policy plug-in for test_sched_policy: shortest prompt
 * first, built as a shared object by mk/schedtests.mk and loaded with tdm_sched_load_policy.
 * tdm_policy_entry is the default entry point; tdm_policy_entry_badver returns a table with
 * an unknown version and tdm_policy_entry_fails reports a failure, for the error paths.
 */
#include "tandem.h"

#define EXPORT __attribute__((visibility("default")))

static int sjf_compare(void *ctx, const tdm_request_view *a, const tdm_request_view *b)
{
    (void)ctx;
    if (a->num_prompt_tokens != b->num_prompt_tokens)
        return a->num_prompt_tokens < b->num_prompt_tokens ? -1 : 1;
    return 0;
}

EXPORT int tdm_policy_entry(tdm_policy *out, uint32_t abi_version);
EXPORT int tdm_policy_entry_badver(tdm_policy *out, uint32_t abi_version);
EXPORT int tdm_policy_entry_fails(tdm_policy *out, uint32_t abi_version);

EXPORT int tdm_policy_entry(tdm_policy *out, uint32_t abi_version)
{
    (void)abi_version;
    out->version = TDM_POLICY_VERSION;
    out->name = "sjf-plugin";
    out->ctx = 0;
    out->compare = sjf_compare;
    out->pick_victim = 0;
    out->destroy = 0;
    return TDM_OK;
}

EXPORT int tdm_policy_entry_badver(tdm_policy *out, uint32_t abi_version)
{
    int rc = tdm_policy_entry(out, abi_version);
    out->version = 999;
    return rc;
}

EXPORT int tdm_policy_entry_fails(tdm_policy *out, uint32_t abi_version)
{
    (void)out;
    (void)abi_version;
    return TDM_E_PLUGIN;
}
