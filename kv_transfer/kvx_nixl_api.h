/*
 * kvx_nixl_api.h -- the part of NIXL's C API (libnixl_capi, shipped in the nixl-cu12 /
 * nixl-cu13 wheels) that Tandem calls, declared here in Tandem's own words so that nothing
 * of NIXL is needed at build time: opaque handle types, the status and enum values Tandem
 * relies on, and a table of function pointers that kvx_nixl_lib.c fills with dlsym. The
 * signatures follow the library's exported C functions (nixl_capi_*); every call returns a
 * status where 0 is success, 1 "in progress" and a negative value an error. Buffers the
 * library returns (local metadata, a loaded agent's name) are malloc'ed and freed with free().
 * Internal to libtandem.
 */
#ifndef TANDEM_KVX_NIXL_API_H
#define TANDEM_KVX_NIXL_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* statuses (nixl_capi_status_t) */
#define TDM__NX_OK 0
#define TDM__NX_IN_PROG 1

/* memory kinds (nixl_capi_mem_type_t) */
#define TDM__NX_DRAM 0
#define TDM__NX_VRAM 1

/* transfer operations (nixl_capi_xfer_op_t) */
#define TDM__NX_READ 0

typedef struct tdm__nx_agent_s *tdm__nx_agent;
typedef struct tdm__nx_backend_s *tdm__nx_backend;
typedef struct tdm__nx_params_s *tdm__nx_params;
typedef struct tdm__nx_mems_s *tdm__nx_mems;
typedef struct tdm__nx_opt_s *tdm__nx_opt;
typedef struct tdm__nx_reg_s *tdm__nx_reg;      /* a list of descriptors to register */
typedef struct tdm__nx_dlist_s *tdm__nx_dlist;  /* a list of descriptors to transfer */
typedef struct tdm__nx_req_s *tdm__nx_req;      /* a transfer request */

/* An agent's configuration (nixl_capi_agent_config_t, in the library's field order). */
typedef struct tdm__nx_agent_cfg {
    bool prog_thread;            /* a NIXL thread progresses the UCX workers */
    bool listen_thread;          /* NIXL's own metadata listener: never (HELLO carries it) */
    int listen_port;
    int thread_sync;             /* 0: none (Tandem serialises its calls) */
    unsigned int num_workers;
    uint64_t pthr_delay_us;      /* the progress thread's poll timeout (0: it never sleeps) */
    uint64_t lthr_delay_us;
    bool capture_telemetry;
} tdm__nx_agent_cfg;

/* The functions, resolved by name ("nixl_capi_" + the field name). */
typedef struct tdm__nx_api {
    int (*create_agent)(const char *name, tdm__nx_agent *agent);
    int (*destroy_agent)(tdm__nx_agent agent);
    int (*get_plugin_params)(tdm__nx_agent agent, const char *plugin, tdm__nx_mems *mems, tdm__nx_params *params);
    int (*destroy_mem_list)(tdm__nx_mems mems);
    int (*destroy_params)(tdm__nx_params params);
    int (*create_backend)(tdm__nx_agent agent, const char *plugin, tdm__nx_params params, tdm__nx_backend *backend);
    int (*destroy_backend)(tdm__nx_backend backend);
    int (*create_opt_args)(tdm__nx_opt *opt);
    int (*destroy_opt_args)(tdm__nx_opt opt);
    int (*opt_args_add_backend)(tdm__nx_opt opt, tdm__nx_backend backend);
    int (*create_reg_dlist)(int mem_type, tdm__nx_reg *list);
    int (*destroy_reg_dlist)(tdm__nx_reg list);
    int (*reg_dlist_add_desc)(tdm__nx_reg list, uintptr_t addr, size_t len, uint64_t dev_id, const void *meta,
                              size_t meta_len);
    int (*register_mem)(tdm__nx_agent agent, tdm__nx_reg list, tdm__nx_opt opt);
    int (*deregister_mem)(tdm__nx_agent agent, tdm__nx_reg list, tdm__nx_opt opt);
    int (*get_local_md)(tdm__nx_agent agent, void **data, size_t *len);
    int (*load_remote_md)(tdm__nx_agent agent, const void *data, size_t len, char **agent_name);
    int (*invalidate_remote_md)(tdm__nx_agent agent, const char *remote_agent);
    int (*create_xfer_dlist)(int mem_type, tdm__nx_dlist *list);
    int (*destroy_xfer_dlist)(tdm__nx_dlist list);
    int (*xfer_dlist_add_desc)(tdm__nx_dlist list, uintptr_t addr, size_t len, uint64_t dev_id);
    int (*create_xfer_req)(tdm__nx_agent agent, int op, tdm__nx_dlist local, tdm__nx_dlist remote,
                           const char *remote_agent, tdm__nx_req *req, tdm__nx_opt opt);
    int (*post_xfer_req)(tdm__nx_agent agent, tdm__nx_req req, tdm__nx_opt opt);
    int (*get_xfer_status)(tdm__nx_agent agent, tdm__nx_req req);
    int (*release_xfer_req)(tdm__nx_agent agent, tdm__nx_req req);
    int (*destroy_xfer_req)(tdm__nx_req req);
    /* optional (NULL when the library lacks it) */
    int (*create_configured_agent)(const char *name, const tdm__nx_agent_cfg *cfg, tdm__nx_agent *agent);
    int (*params_add)(tdm__nx_params params, const char *key, const char *value);   /* a backend parameter */
    int (*opt_args_set_custom_param)(tdm__nx_opt opt, const void *data, size_t len); /* e.g. "worker_id=2" */
} tdm__nx_api;

/* Loads libnixl_capi once per process (TANDEM_NIXL_LIB: a file; TANDEM_NIXL_DIR: the
 * directory holding it; else the library search path; else beside an installed nixl wheel
 * found from TANDEM_NIXL_PYTHON's or python3's site-packages) and resolves every function
 * above. Returns the table, or NULL with why[why_len] saying what was tried. Thread-safe. */
const tdm__nx_api *tdm__nx_load(char *why, size_t why_len);

#endif /* TANDEM_KVX_NIXL_API_H */
