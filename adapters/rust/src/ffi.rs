//! Hand-written `extern "C"` declarations of include/tandem.h (the scheduler part). Field
//! order and types follow the header exactly; `tests/layout.rs` checks the sizes.
#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_int, c_uint, c_void};

pub type tdm_token = i32;

#[repr(C)]
pub struct tdm_sched {
    _private: [u8; 0],
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct tdm_request_desc {
    pub struct_size: u32,
    pub flags: u32,
    pub id: u64,
    pub prompt: *const tdm_token,
    pub num_prompt_tokens: u32,
    pub max_tokens: u32,
    pub min_tokens: u32,
    pub eos_token_id: i32,
    pub stop_token_ids: *const tdm_token,
    pub num_stop_token_ids: u32,
    pub priority: i32,
    pub arrival_time: f64,
    pub ttft_slo: f64,
    pub tpot_slo: f64,
    pub cache_salt: *const c_void,
    pub cache_salt_len: u32,
    pub num_remote_tokens: u32,
    pub tenant: u32,
    pub block_hashes: *const c_void,
    pub num_block_hashes: u32,
    pub block_hash_size: u32,
    pub prefix_hit_limit: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct tdm_batch {
    pub struct_size: u32,
    pub num_reqs: u32,
    pub step: u64,
    pub total_tokens: u32,
    pub num_prefill_reqs: u32,
    pub req_ids: *const u64,
    pub num_tokens: *const u32,
    pub num_computed: *const u32,
    pub kinds: *const u8,
    pub num_spec: *const u32,
    pub block_offsets: *const u32,
    pub blocks: *const u32,
    pub num_preempted: u32,
    pub preempted_ids: *const u64,
    pub num_finished: u32,
    pub finished_ids: *const u64,
    pub num_recv_ready: u32,
    pub recv_ready_ids: *const u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct tdm_step_output {
    pub struct_size: u32,
    pub num_reqs: u32,
    pub req_ids: *const u64,
    pub token_offsets: *const u32,
    pub tokens: *const tdm_token,
    pub now: f64,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct tdm_update_result {
    pub struct_size: u32,
    pub num_reqs: u32,
    pub req_ids: *const u64,
    pub num_new_tokens: *const u32,
    pub finish_reasons: *const u8,
    pub stop_tokens: *const i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct tdm_request_info {
    pub struct_size: u32,
    pub state: u32,
    pub finish_reason: u32,
    pub num_prompt_tokens: u32,
    pub num_output_tokens: u32,
    pub num_computed_tokens: u32,
    pub num_cached_tokens: u32,
    pub num_blocks: u32,
    pub num_preemptions: u32,
    pub priority: i32,
    pub arrival_time: f64,
    pub first_scheduled_time: f64,
    pub first_token_time: f64,
    pub last_token_time: f64,
    pub finish_time: f64,
    pub max_token_gap: f64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct tdm_sched_stats {
    pub struct_size: u32,
    pub num_running: u32,
    pub num_waiting: u32,
    pub num_waiting_remote_kv: u32,
    pub num_held: u32,
    pub num_total_blocks: u32,
    pub num_free_blocks: u32,
    pub num_cached_blocks: u32,
    pub kv_usage: f64,
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    pub prefix_hit_rate: f64,
    pub evictions: u64,
    pub preemptions: u64,
    pub steps: u64,
    pub scheduled_tokens: u64,
    pub finished: u64,
}

extern "C" {
    pub fn tdm_version_number() -> c_uint;
    pub fn tdm_version_string() -> *const c_char;
    pub fn tdm_abi_version() -> c_uint;
    pub fn tdm_strerror(status: c_int) -> *const c_char;

    pub fn tdm_sched_create(out: *mut *mut tdm_sched) -> c_int;
    pub fn tdm_sched_destroy(s: *mut tdm_sched);
    pub fn tdm_sched_errmsg(s: *const tdm_sched) -> *const c_char;
    pub fn tdm_sched_configure(s: *mut tdm_sched, json: *const c_char) -> c_int;
    pub fn tdm_sched_get_config(s: *const tdm_sched, buf: *mut c_char, buf_size: usize,
                                len: *mut usize) -> c_int;
    pub fn tdm_sched_set_param(s: *mut tdm_sched, key: c_int, value: i64) -> c_int;
    pub fn tdm_sched_get_param(s: *const tdm_sched, key: c_int, value: *mut i64) -> c_int;
    pub fn tdm_request_desc_init(d: *mut tdm_request_desc) -> c_int;
    pub fn tdm_sched_add(s: *mut tdm_sched, d: *const tdm_request_desc) -> c_int;
    pub fn tdm_sched_abort(s: *mut tdm_sched, id: u64) -> c_int;
    pub fn tdm_sched_finish(s: *mut tdm_sched, id: u64, reason: c_int) -> c_int;
    pub fn tdm_batch_init(b: *mut tdm_batch) -> c_int;
    pub fn tdm_sched_step(s: *mut tdm_sched, now: f64, out: *mut tdm_batch) -> c_int;
    pub fn tdm_step_output_init(o: *mut tdm_step_output) -> c_int;
    pub fn tdm_update_result_init(r: *mut tdm_update_result) -> c_int;
    pub fn tdm_sched_update(s: *mut tdm_sched, out: *const tdm_step_output,
                            result: *mut tdm_update_result) -> c_int;
    pub fn tdm_sched_update_step(s: *mut tdm_sched, step: u64, out: *const tdm_step_output,
                                 result: *mut tdm_update_result) -> c_int;
    pub fn tdm_sched_set_draft_tokens(s: *mut tdm_sched, id: u64, tokens: *const tdm_token,
                                      n: u32) -> c_int;
    pub fn tdm_request_info_init(i: *mut tdm_request_info) -> c_int;
    pub fn tdm_sched_request_info(s: *const tdm_sched, id: u64, info: *mut tdm_request_info)
        -> c_int;
    pub fn tdm_sched_request_blocks(s: *const tdm_sched, id: u64, blocks: *mut *const u32,
                                    num_blocks: *mut u32) -> c_int;
    pub fn tdm_sched_request_tokens(s: *const tdm_sched, id: u64, tokens: *mut *const tdm_token,
                                    num_tokens: *mut u32) -> c_int;
    pub fn tdm_sched_remote_kv_done(s: *mut tdm_sched, id: u64, ok: c_int,
                                    num_valid_tokens: u32) -> c_int;
    pub fn tdm_sched_release(s: *mut tdm_sched, id: u64) -> c_int;
    pub fn tdm_sched_reset_prefix_cache(s: *mut tdm_sched, reset_running: c_int) -> c_int;
    pub fn tdm_sched_stats_init(st: *mut tdm_sched_stats) -> c_int;
    pub fn tdm_sched_get_stats(s: *const tdm_sched, st: *mut tdm_sched_stats) -> c_int;
    pub fn tdm_sched_num_unfinished(s: *const tdm_sched, n: *mut u32) -> c_int;
    // TANDEM_1.3
    pub fn tdm_prefix_digests(algo: c_int, block_size: u32, cache_salt: *const c_void,
                              cache_salt_len: u32, tokens: *const tdm_token, num_tokens: u32,
                              out: *mut c_void, out_size: usize, num_digests: *mut u32) -> c_int;
    pub fn tdm_prefix_errmsg() -> *const c_char;
}

// ---- KV layouts and the transfer engine (tandem_kernels.h, tandem_kvx.h) ------------------------

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct tdm_kv_layout {
    pub struct_size: u32,
    pub kind: u32,
    pub num_layers: u32,
    pub num_blocks: u32,
    pub block_size: u32,
    pub num_kv_heads: u32,
    pub head_dim: u32,
    pub dtype: u32,
    pub stride_kv: i64,
    pub stride_block: i64,
    pub stride_token: i64,
    pub stride_head: i64,
}

#[repr(C)]
pub struct tdm_kvx {
    _private: [u8; 0],
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct tdm_kvx_recv_desc {
    pub struct_size: u32,
    pub mode: u32,
    pub peer: u32,
    pub num_blocks: u32,
    pub request_id: u64,
    pub transfer_id: u64,
    pub block_ids: *const u32,
    pub num_skip: u32,
    pub timeout_ms: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct tdm_kvx_send_desc {
    pub struct_size: u32,
    pub mode: u32,
    pub peer: u32,
    pub num_blocks: u32,
    pub request_id: u64,
    pub transfer_id: u64,
    pub block_ids: *const u32,
    pub num_blocks_ready: u32,
    pub timeout_ms: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct tdm_kvx_event {
    pub struct_size: u32,
    pub type_: u32,
    pub side: u32,
    pub status: i32,
    pub handle: u64,
    pub request_id: u64,
    pub transfer_id: u64,
    pub peer: u32,
    pub num_blocks_done: u32,
    pub bytes: u64,
    pub reason: [c_char; 128],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct tdm_kvx_stats {
    pub struct_size: u32,
    pub num_peers: u32,
    pub num_send_active: u32,
    pub num_recv_active: u32,
    pub num_reserved_blocks: u32,
    pub num_queued_events: u32,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub msgs_rejected: u64,
    pub transfers_done: u64,
    pub transfers_failed: u64,
    pub transfers_cancelled: u64,
    pub chunks_sent: u64,
    pub chunks_sent_shm: u64,
}

pub const TDM_KVX_PEER_ANY: u32 = 0xFFFF_FFFF;

extern "C" {
    pub fn tdm_dtype_size(dt: c_int) -> usize;
    pub fn tdm_kv_layout_init(l: *mut tdm_kv_layout, kind: c_int, num_layers: u32, num_blocks: u32,
                              block_size: u32, num_kv_heads: u32, head_dim: u32, dtype: c_int) -> c_int;
    pub fn tdm_kvx_create_json(json: *const c_char, out: *mut *mut tdm_kvx) -> c_int;
    pub fn tdm_kvx_destroy(k: *mut tdm_kvx);
    pub fn tdm_kvx_errmsg(k: *const tdm_kvx) -> *const c_char;
    pub fn tdm_kvx_get_endpoint(k: *mut tdm_kvx, buf: *mut c_char, buf_size: usize) -> c_int;
    pub fn tdm_kvx_register(k: *mut tdm_kvx, layout: *const tdm_kv_layout,
                            layer_bases: *const *mut c_void, mem_kind: u32, head_offset: u32) -> c_int;
    pub fn tdm_kvx_connect(k: *mut tdm_kvx, endpoint: *const c_char, server_public_key: *const c_char,
                           peer: *mut u32) -> c_int;
    pub fn tdm_kvx_recv_desc_init(d: *mut tdm_kvx_recv_desc) -> c_int;
    pub fn tdm_kvx_recv(k: *mut tdm_kvx, d: *const tdm_kvx_recv_desc, handle: *mut u64) -> c_int;
    pub fn tdm_kvx_send_desc_init(d: *mut tdm_kvx_send_desc) -> c_int;
    pub fn tdm_kvx_send(k: *mut tdm_kvx, d: *const tdm_kvx_send_desc, handle: *mut u64) -> c_int;
    pub fn tdm_kvx_event_init(e: *mut tdm_kvx_event) -> c_int;
    pub fn tdm_kvx_poll(k: *mut tdm_kvx, events: *mut tdm_kvx_event, max: u32, n: *mut u32,
                        timeout_ms: c_int) -> c_int;
    pub fn tdm_kvx_stats_init(s: *mut tdm_kvx_stats) -> c_int;
    pub fn tdm_kvx_get_stats(k: *mut tdm_kvx, s: *mut tdm_kvx_stats) -> c_int;
}
