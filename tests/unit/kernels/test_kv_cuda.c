/*
 * test_kv_cuda.c -- the CUDA entry points without (or with) a GPU: each scenario runs in a
 * forked child because the CUDA library is loaded once per process. Without a usable
 * library or device every wrapper returns TDM_E_NO_CUDA with a clear message (and bad
 * arguments are still refused with TDM_E_INVAL first); with a GPU, a pack and an unpack
 * through CUDA are compared with the CPU. Also `tandem profile` without a GPU: exit status
 * 3 and the message. (scripts/gpu-check.sh runs the full device check.)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <cmocka.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kv_test_util.h"

/* Runs fn in a child; returns its exit status (or -1 if it crashed). */
static int in_child(int (*fn)(void *), void *arg)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) _exit(fn(arg));
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) return -1;
    return WEXITSTATUS(st);
}

/* Every wrapper, with valid arguments, returns rc; exit codes say which step failed. */
static int wrappers_all_return(int want, const char *needle)
{
    tdm_kv_layout l, pl;
    tdm_kv_layout_init(&l, TDM_KV_LAYOUT_VLLM_NHD, 1, 4, 16, 2, 8, TDM_DTYPE_FP16);
    tdm_kv_layout_init(&pl, TDM_KV_LAYOUT_VLLM_NHD, 1, 1, 16, 2, 8, TDM_DTYPE_FP16);
    static char dev[2 * 16 * 2 * 8 * 2 * 4];
    void *bases[1] = {dev};
    uint32_t ids[1] = {1};
    char buf[1024], msg[256];
    void *p = NULL;
    tdm_profile_spec spec;
    tdm_profile_spec_init(&spec);
    size_t len = 0;
    if (tdm_cuda_available(msg, sizeof msg) != want || !strstr(msg, needle)) {
        fprintf(stderr, "tdm_cuda_available: %s\n", msg);
        return 10;
    }
    if (tdm_kv_pack_cuda(&l, bases, ids, 1, 0, 1, buf, sizeof buf, NULL) != want) return 11;
    if (!strstr(tdm_kv_errmsg(), needle)) return 12;
    if (tdm_kv_unpack_cuda(&l, bases, ids, 1, 0, 1, buf, sizeof buf, NULL) != want) return 13;
    if (tdm_kv_unpack_convert_cuda(&pl, buf, sizeof buf, 1, 16, &l, bases, ids, 1, NULL, NULL) != want) return 14;
    if (tdm_kv_pack_convert_cuda(&l, bases, ids, 1, &pl, buf, sizeof buf, NULL, NULL) != want) return 15;
    if (tdm_cuda_malloc(&p, 64) != want || p) return 16;
    if (tdm_cuda_memcpy(buf, buf + 8, 8, TDM_CUDA_COPY_DEFAULT) != want) return 17;
    if (tdm_cuda_memset(buf, 0, 8) != want) return 18;
    if (tdm_cuda_memcpy_async(buf, buf + 8, 8, TDM_CUDA_COPY_DEFAULT, NULL) != want) return 25;
    if (tdm_cuda_stream_sync(NULL) != want) return 19;
    if (tdm_cuda_free(buf) != want) return 20;
    if (tdm_cuda_profile(&spec, buf, sizeof buf, &len) != want || len) return 21;
    /* bad arguments are refused before CUDA is looked at */
    ids[0] = 9;
    if (tdm_kv_pack_cuda(&l, bases, ids, 1, 0, 1, buf, sizeof buf, NULL) != TDM_E_INVAL) return 22;
    if (tdm_kv_pack_cuda(&l, bases, ids, 1, 0, 1, buf, sizeof buf, NULL) != TDM_E_INVAL) return 22;
    if (tdm_cuda_malloc(NULL, 64) != TDM_E_INVAL) return 23;
    if (tdm_cuda_free(NULL) != TDM_OK) return 24;
    return 0;
}

static int child_missing_lib(void *arg)
{
    (void)arg;
    setenv("TANDEM_CUDA_LIB", "/nonexistent/libtandem_cuda.so", 1);
    return wrappers_all_return(TDM_E_NO_CUDA, "libtandem_cuda.so not found");
}

static void cuda_wrappers__missing_library_gives_no_cuda(void **state)
{
    (void)state;
    assert_int_equal(in_child(child_missing_lib, NULL), 0);
}

static int child_default_search(void *arg)
{
    (void)arg;
    unsetenv("TANDEM_CUDA_LIB");
    char msg[256];
    int rc = tdm_cuda_available(msg, sizeof msg);
    if (rc == TDM_OK) return 0;          /* a GPU host with the library installed */
    if (rc != TDM_E_NO_CUDA || !msg[0]) return 30;
    return strstr(msg, "libtandem_cuda.so") || strstr(msg, "no CUDA device") ? 0 : 31;
}

static void cuda_available__default_search_never_crashes(void **state)
{
    (void)state;
    assert_int_equal(in_child(child_default_search, NULL), 0);
}

/* With the built library: no GPU -> NO_CUDA "no CUDA device" (or a load failure);
 * with a GPU -> CUDA pack/unpack agree with the CPU. */
static int child_built_lib(void *arg)
{
    setenv("TANDEM_CUDA_LIB", (const char *)arg, 1);
    char msg[256];
    int rc = tdm_cuda_available(msg, sizeof msg);
    if (rc != TDM_OK) {
        if (rc != TDM_E_NO_CUDA) return 40;
        if (!strstr(msg, "no CUDA device") && !strstr(msg, "libtandem_cuda.so")) return 41;
        return wrappers_all_return(TDM_E_NO_CUDA, strstr(msg, "no CUDA device") ? "no CUDA device"
                                                                                 : "libtandem_cuda.so");
    }
    tdm_kv_layout l;
    tdm_kv_layout_init(&l, TDM_KV_LAYOUT_VLLM_HND, 2, 16, 16, 4, 64, TDM_DTYPE_BF16);
    test_cache c;
    if (cache_alloc(&c, &l)) return 42;
    cache_fill_random(&c);
    uint32_t ids[5] = {3, 9, 0, 15, 4};
    size_t need;
    tdm_kv_packed_size(&l, 5, 0, 2, &need);
    uint8_t *cpu = malloc(need), *gpu = malloc(need);
    void *dbases[2], *dbuf;
    for (int i = 0; i < 2; i++) {
        if (tdm_cuda_malloc(&dbases[i], c.layer_bytes) ||
            tdm_cuda_memcpy(dbases[i], c.bases[i], c.layer_bytes, TDM_CUDA_COPY_HOST_TO_DEVICE))
            return 43;
    }
    if (tdm_cuda_malloc(&dbuf, need) || tdm_cuda_memset(dbuf, POISON, need)) return 44;
    if (tdm_kv_pack(&l, c.bases, ids, 5, 0, 2, cpu, need)) return 45;
    if (tdm_kv_pack_cuda(&l, dbases, ids, 5, 0, 2, dbuf, need, NULL) || tdm_cuda_stream_sync(NULL))
        return 46;
    if (tdm_cuda_memcpy(gpu, dbuf, need, TDM_CUDA_COPY_DEVICE_TO_HOST)) return 47;
    if (memcmp(cpu, gpu, need)) return 48;
    for (int i = 0; i < 2; i++) tdm_cuda_free(dbases[i]);
    tdm_cuda_free(dbuf);
    free(cpu);
    free(gpu);
    cache_free(&c);
    return 0;
}

static void cuda_wrappers__built_library_without_gpu_or_with_one(void **state)
{
    (void)state;
    const char *b = getenv("TANDEM_BUILD");
    char path[1024];
    snprintf(path, sizeof path, "%s/libtandem_cuda.so", b ? b : "build");
    if (access(path, R_OK) != 0) {
        printf("skipped: %s not built (no nvcc, or HAVE_CUDA=0)\n", path);
        skip();
    }
    assert_int_equal(in_child(child_built_lib, path), 0);
}

static void profile_cli__without_gpu_exits_3_with_message(void **state)
{
    (void)state;
    const char *b = getenv("TANDEM_BUILD");
    char tool[1024], cmd[2300];
    snprintf(tool, sizeof tool, "%s/tandem", b ? b : "build");
    if (access(tool, X_OK) != 0) {
        printf("skipped: %s not built\n", tool);
        skip();
    }
    if (tdm_cuda_available(NULL, 0) == TDM_OK) {
        printf("skipped: a GPU is present (scripts/gpu-check.sh runs the profiler)\n");
        skip();
    }
    snprintf(cmd, sizeof cmd, "'%s' profile --model llama-3-8b --out /dev/null 2>&1", tool);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    char out[4096] = "";
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = '\0';
    int st = pclose(f);
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) != 3) fail_msg("exit %d, output: %s", WEXITSTATUS(st), out);
    assert_true(strstr(out, "no CUDA device") || strstr(out, "libtandem_cuda.so"));
    /* unknown model: usage error, not 3 */
    snprintf(cmd, sizeof cmd, "'%s' profile --model no-such-model >/dev/null 2>&1", tool);
    st = system(cmd);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cuda_wrappers__missing_library_gives_no_cuda),
        cmocka_unit_test(cuda_available__default_search_never_crashes),
        cmocka_unit_test(cuda_wrappers__built_library_without_gpu_or_with_one),
        cmocka_unit_test(profile_cli__without_gpu_exits_3_with_message),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
