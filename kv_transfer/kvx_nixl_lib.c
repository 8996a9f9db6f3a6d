/*
 * kvx_nixl_lib.c -- finds and opens NIXL's C API library at run time (never at build or link
 * time: libtandem links and runs without it). Search order: TANDEM_NIXL_LIB (the library
 * file itself); TANDEM_NIXL_DIR (a directory holding it, or a site-packages directory where
 * the nixl-cu12 / nixl-cu13 wheel put it under .nixl_cu1X.mesonpy.libs/); the dynamic
 * linker's own search path; the site-packages of the active virtualenv ($VIRTUAL_ENV). Each
 * place is tried as libnixl_capi.so.0 (the soname upstream is moving to) then libnixl_capi.so.
 * The first library whose every function Tandem uses resolves wins; the result (or the
 * reason it failed) is kept for the life of the process.
 */
#include <dlfcn.h>
#include <glob.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvx_nixl_api.h"

static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;
static int load_done;
static tdm__nx_api api;
static const tdm__nx_api *api_ok;
static char load_why[512];

static const char *const sonames[] = { "libnixl_capi.so.0", "libnixl_capi.so" };

/* Resolves the table from h; 0 on success, else names the first missing symbol. */
static int resolve(void *h, tdm__nx_api *a, char *why, size_t why_len)
{
#define SYM(f)                                                                                  \
    do {                                                                                        \
        void *s_ = dlsym(h, "nixl_capi_" #f);                                                   \
        if (!s_) { snprintf(why, why_len, "symbol nixl_capi_" #f " missing"); return -1; }     \
        memcpy(&a->f, &s_, sizeof(s_));                                                         \
    } while (0)
    SYM(create_agent); SYM(destroy_agent); SYM(get_plugin_params); SYM(destroy_mem_list);
    SYM(destroy_params); SYM(create_backend); SYM(destroy_backend); SYM(create_opt_args);
    SYM(destroy_opt_args); SYM(opt_args_add_backend); SYM(create_reg_dlist); SYM(destroy_reg_dlist);
    SYM(reg_dlist_add_desc); SYM(register_mem); SYM(deregister_mem); SYM(get_local_md);
    SYM(load_remote_md); SYM(invalidate_remote_md); SYM(create_xfer_dlist); SYM(destroy_xfer_dlist);
    SYM(xfer_dlist_add_desc); SYM(create_xfer_req); SYM(post_xfer_req); SYM(get_xfer_status);
    SYM(release_xfer_req); SYM(destroy_xfer_req);
#undef SYM
    void *o_ = dlsym(h, "nixl_capi_create_configured_agent");   /* optional */
    memcpy(&a->create_configured_agent, &o_, sizeof(o_));
    o_ = dlsym(h, "nixl_capi_params_add");
    memcpy(&a->params_add, &o_, sizeof(o_));
    o_ = dlsym(h, "nixl_capi_opt_args_set_custom_param");
    memcpy(&a->opt_args_set_custom_param, &o_, sizeof(o_));
    return 0;
}

/* Tries one path (a file name or a bare soname); 1 when the table is complete. */
static int try_open(const char *path, char *tried, size_t tried_len)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    size_t used = strlen(tried);
    if (!h) {
        const char *e = dlerror();
        if (used + 1 < tried_len)
            snprintf(tried + used, tried_len - used, "%s%s: %.120s", used ? "; " : "", path, e ? e : "not found");
        return 0;
    }
    char why[128];
    if (resolve(h, &api, why, sizeof(why)) != 0) {
        if (used + 1 < tried_len) snprintf(tried + used, tried_len - used, "%s%s: %s", used ? "; " : "", path, why);
        dlclose(h);
        return 0;
    }
    return 1;   /* kept open for the life of the process */
}

/* Tries dir/soname for each soname, then the wheel's library directories under dir. */
static int try_dir(const char *dir, char *tried, size_t tried_len)
{
    char path[1024];
    for (size_t i = 0; i < sizeof(sonames) / sizeof(sonames[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, sonames[i]);
        if (try_open(path, tried, tried_len)) return 1;
    }
    snprintf(path, sizeof(path), "%s/.nixl_cu1*.mesonpy.libs/libnixl_capi.so*", dir);
    glob_t g;
    int found = 0;
    if (glob(path, 0, NULL, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc && !found; i++) found = try_open(g.gl_pathv[i], tried, tried_len);
        globfree(&g);
    }
    return found;
}

const tdm__nx_api *tdm__nx_load(char *why, size_t why_len)
{
    pthread_mutex_lock(&load_mu);
    if (!load_done) {
        char tried[sizeof(load_why)] = "";
        const char *lib = getenv("TANDEM_NIXL_LIB"), *dir = getenv("TANDEM_NIXL_DIR");
        const char *venv = getenv("VIRTUAL_ENV");
        int ok = 0;
        if (lib && lib[0]) ok = try_open(lib, tried, sizeof(tried));
        if (!ok && dir && dir[0]) ok = try_dir(dir, tried, sizeof(tried));
        for (size_t i = 0; !ok && i < sizeof(sonames) / sizeof(sonames[0]); i++) ok = try_open(sonames[i], tried, sizeof(tried));
        if (!ok && venv && venv[0]) {
            char pat[1024];
            snprintf(pat, sizeof(pat), "%s/lib/python3*/site-packages", venv);
            glob_t g;
            if (glob(pat, 0, NULL, &g) == 0) {
                for (size_t i = 0; i < g.gl_pathc && !ok; i++) ok = try_dir(g.gl_pathv[i], tried, sizeof(tried));
                globfree(&g);
            }
        }
        if (ok) api_ok = &api;
        else snprintf(load_why, sizeof(load_why), "libnixl_capi not found (set TANDEM_NIXL_LIB or TANDEM_NIXL_DIR; "
                      "pip install nixl-cu12): %s", tried);
        load_done = 1;
    }
    const tdm__nx_api *r = api_ok;
    if (!r && why && why_len) snprintf(why, why_len, "%s", load_why);
    pthread_mutex_unlock(&load_mu);
    return r;
}
