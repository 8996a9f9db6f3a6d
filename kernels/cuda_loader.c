/*
 * cuda_loader.c -- opens libtandem_cuda.so lazily, the first time a CUDA function of
 * libtandem is called, so that libtandem.so itself never needs CUDA: $TANDEM_CUDA_LIB if
 * set, else the file next to libtandem.so (found with dladdr), else "libtandem_cuda.so" on
 * the loader's search path. It resolves one symbol, tdm_cuda_get_table_v1, checks the
 * table's version and sizes, and asks it once whether a device is usable. The outcome
 * (table or reason) is computed once under pthread_once and kept for the process.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_table.h"
#include "kv_internal.h"

#define LIB_NAME "libtandem_cuda.so"

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static const tdm__cuda_table *g_table;
static int g_status = TDM_E_NO_CUDA;
static char g_msg[TDM_ERRMSG_LEN];

/* The directory of the object that holds this code (libtandem.so, or the executable when
 * linked statically), with a trailing '/', or "" if unknown. */
static void own_dir(char *buf, size_t len)
{
    Dl_info info;
    buf[0] = '\0';
    if (!dladdr((void *)&tdm__cuda_table_get, &info) || !info.dli_fname) return;
    const char *slash = strrchr(info.dli_fname, '/');
    if (!slash) return;
    size_t n = (size_t)(slash - info.dli_fname) + 1;
    if (n >= len) return;
    memcpy(buf, info.dli_fname, n);
    buf[n] = '\0';
}

static void *open_lib(void)
{
    const char *env = getenv("TANDEM_CUDA_LIB");
    void *h;
    if (env && *env) {
        h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
        if (!h)
            snprintf(g_msg, sizeof g_msg, "libtandem_cuda.so not found: TANDEM_CUDA_LIB=%.80s: %.120s",
                     env, dlerror());
        return h;
    }
    char path[512];
    own_dir(path, sizeof path - sizeof LIB_NAME);
    if (path[0]) {
        strcat(path, LIB_NAME);
        if (access(path, F_OK) == 0) {
            h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
            if (!h)
                snprintf(g_msg, sizeof g_msg, "libtandem_cuda.so could not be loaded: %.200s",
                         dlerror());
            return h;
        }
    }
    h = dlopen(LIB_NAME, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        snprintf(g_msg, sizeof g_msg, "libtandem_cuda.so not found: %.150s (build it with "
                 "nvcc, or set TANDEM_CUDA_LIB)", dlerror());
    return h;
}

static void load_once(void)
{
    void *h = open_lib();
    if (!h) return;
    tdm__cuda_get_table_fn get;
    *(void **)&get = dlsym(h, TDM__CUDA_TABLE_SYMBOL);
    const tdm__cuda_table *t = get ? get() : NULL;
    if (!t) {
        snprintf(g_msg, sizeof g_msg, "libtandem_cuda.so has no usable %s",
                 TDM__CUDA_TABLE_SYMBOL);
        dlclose(h);
        return;
    }
    if (t->version != TDM__CUDA_TABLE_VERSION || t->size < sizeof(tdm__cuda_table) ||
        t->plan_size != sizeof(tdm__kv_plan)) {
        snprintf(g_msg, sizeof g_msg, "libtandem_cuda.so does not match this libtandem (table "
                 "version %u size %u plan %u; expected %u, %zu, %zu)", t->version, t->size,
                 t->plan_size, TDM__CUDA_TABLE_VERSION, sizeof(tdm__cuda_table),
                 sizeof(tdm__kv_plan));
        g_status = TDM_E_VERSION;
        dlclose(h);
        return;
    }
    char msg[TDM_ERRMSG_LEN] = "";
    int rc = t->device_check(msg, sizeof msg);
    if (rc != TDM_OK) {
        snprintf(g_msg, sizeof g_msg, "%s", msg[0] ? msg : "no CUDA device");
        g_status = rc == TDM_E_NO_CUDA ? rc : TDM_E_NO_CUDA;
        /* keep the library loaded: cudart may not like being unloaded after init */
        return;
    }
    g_table = t;
    g_status = TDM_OK;
}

int tdm__cuda_table_get(const tdm__cuda_table **out)
{
    pthread_once(&g_once, load_once);
    if (!g_table) return tdm__kv_fail(g_status, "%s", g_msg);
    *out = g_table;
    return TDM_OK;
}

int tdm_cuda_available(char *msg, size_t msg_len)
{
    const tdm__cuda_table *t;
    int rc = tdm__cuda_table_get(&t);
    if (msg && msg_len) snprintf(msg, msg_len, "%s", rc ? g_msg : "CUDA available");
    return rc;
}
