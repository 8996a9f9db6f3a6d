//! Safe Rust bindings to libtandem, the scheduling and KV-transfer layer of an LLM serving
//! engine (include/tandem.h). No external crates: `ffi` holds hand-written `extern "C"`
//! declarations, and this module wraps them in an owned [`Scheduler`] (destroyed on Drop),
//! [`Result`]s carrying the library's status and message, and borrowed slices over the
//! batch arrays (the borrow checker enforces the header's "valid until the next step").
//!
//! ```no_run
//! let mut s = tandem::Scheduler::with_config(r#"{"block_size": 16}"#).unwrap();
//! s.add(&tandem::Request::new(1, &[1, 2, 3]).max_tokens(4)).unwrap();
//! let batch = s.step(0.0).unwrap();
//! assert_eq!(batch.req_ids(), &[1]);
//! ```
//! A `Scheduler` is `Send` but not `Sync` (the C handle is not thread-safe).

pub mod ffi;
pub mod kvx;

pub use kvx::{KvEvent, KvLayout, KvTransfer};

use std::ffi::{CStr, CString};
use std::fmt;
use std::os::raw::c_int;
use std::ptr::{self, NonNull};

/// The ABI version these bindings were written for; [`check_abi`] compares it with the
/// loaded library's.
pub const ABI_VERSION: u32 = 1;

/// A failed library call: the TDM_E_* status, its name and the handle's detailed message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub status: i32,
    pub name: String,
    pub message: String,
}

impl Error {
    fn new(status: c_int, message: String) -> Error {
        Error { status, name: strerror(status), message }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "{} ({})", self.name, self.status)
        } else {
            write!(f, "{}: {} ({})", self.name, self.message, self.status)
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// Status codes (include/tandem.h).
pub mod status {
    pub const OK: i32 = 0;
    pub const INVAL: i32 = -1;
    pub const NOMEM: i32 = -2;
    pub const NOT_FOUND: i32 = -3;
    pub const EXISTS: i32 = -4;
    pub const STATE: i32 = -5;
    pub const RANGE: i32 = -6;
    pub const CONFIG: i32 = -7;
    pub const NO_SPACE: i32 = -8;
    pub const TRUNCATED: i32 = -22;
    pub const PEER: i32 = -19;
    pub const VERSION: i32 = -15;
}

/// The name of a status code (tdm_strerror).
pub fn strerror(status: i32) -> String {
    unsafe { CStr::from_ptr(ffi::tdm_strerror(status)) }.to_string_lossy().into_owned()
}

/// The loaded library's version string.
pub fn version() -> String {
    unsafe { CStr::from_ptr(ffi::tdm_version_string()) }.to_string_lossy().into_owned()
}

/// Ok when the loaded library's ABI version is the one these bindings were written for.
pub fn check_abi() -> Result<()> {
    let v = unsafe { ffi::tdm_abi_version() };
    if v == ABI_VERSION {
        Ok(())
    } else {
        Err(Error::new(status::VERSION,
                       format!("libtandem has ABI version {v}, these bindings need {ABI_VERSION}")))
    }
}

/// Scheduler parameters (tdm_sched_param).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum Param {
    MaxNumBatchedTokens = 1,
    MaxNumSeqs = 2,
    MaxModelLen = 3,
    LongPrefillTokenThreshold = 4,
    EnableChunkedPrefill = 5,
    NumBlocks = 6,
    BlockSize = 7,
    EnablePrefixCaching = 8,
    WatermarkPpm = 9,
    Policy = 10,
    Mode = 11,
    TbtTargetUs = 12,
    NumLookaheadTokens = 13,
    Role = 14,
    RemoteKvFailure = 15,
    RemoteKvTimeoutMs = 16,
    DelayFreeTimeoutMs = 17,
    MaxNumPartialPrefills = 18,
    PrefixHash = 19,
    ReserveFullPrompt = 20,
    ContinueAfterSelfPreemption = 21,
    EnableKvEvents = 22,
    KvEventsCapacity = 23,
    AsyncScheduling = 24,
    SloTtftUs = 25,
    SloTpotUs = 26,
    LongPrefillNeedsChunking = 27,
    CacheAwareWindow = 28,
    CacheAwareThresholdPpm = 29,
    MaxInflightKvLoads = 30,
    KvLoadQueues = 31,
    DeferBlockFree = 32,
    DecodeStagger = 33,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    None = 0,
    Stop = 1,
    Length = 2,
    Abort = 3,
    Error = 4,
}

impl FinishReason {
    pub fn from_raw(v: u32) -> FinishReason {
        match v {
            1 => FinishReason::Stop,
            2 => FinishReason::Length,
            3 => FinishReason::Abort,
            4 => FinishReason::Error,
            _ => FinishReason::None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    New = 0,
    Resumed = 1,
    Continuing = 2,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestState {
    Waiting = 0,
    WaitingRemoteKv = 1,
    Running = 2,
    Preempted = 3,
    FinishedHeld = 4,
    Finished = 5,
}

pub const FLAG_IGNORE_EOS: u32 = 1 << 0;
pub const FLAG_REMOTE_PREFILL: u32 = 1 << 1;
pub const FLAG_REMOTE_DECODE: u32 = 1 << 2;
pub const FLAG_SKIP_PREFIX_CACHE: u32 = 1 << 3;
/// SLO_ADAPTIVE may put the request last once it can no longer meet its TTFT.
pub const FLAG_SLO_DEPRIORITIZE: u32 = 1 << 4;
/// Read at most `prefix_hit_limit` tokens from the prefix cache (ABI 1.2).
pub const FLAG_PREFIX_HIT_LIMIT: u32 = 1 << 5;
/// With MaxInflightKvLoads: the request may load its KV remotely and waits in the load queue.
pub const FLAG_MAY_LOAD_ASYNC: u32 = 1 << 6;
/// `block_hashes` hold Tandem's own digests computed ahead by `tdm_prefix_digests` (ABI 1.3).
pub const FLAG_PRECOMPUTED_DIGESTS: u32 = 1 << 7;

/// The parameters of one request to add (borrowed; the library copies them).
#[derive(Clone, Debug)]
pub struct Request<'a> {
    pub id: u64,
    pub prompt: &'a [i32],
    pub max_tokens: u32,
    pub min_tokens: u32,
    pub eos_token_id: Option<i32>,
    pub stop_token_ids: &'a [i32],
    pub priority: i32,
    pub arrival_time: f64,
    pub ttft_slo: f64,
    pub tpot_slo: f64,
    pub cache_salt: &'a [u8],
    pub num_remote_tokens: u32,
    pub tenant: u32,
    pub flags: u32,
}

impl<'a> Request<'a> {
    pub fn new(id: u64, prompt: &'a [i32]) -> Request<'a> {
        Request {
            id,
            prompt,
            max_tokens: 16,
            min_tokens: 0,
            eos_token_id: None,
            stop_token_ids: &[],
            priority: 0,
            arrival_time: 0.0,
            ttft_slo: 0.0,
            tpot_slo: 0.0,
            cache_salt: &[],
            num_remote_tokens: 0,
            tenant: 0,
            flags: 0,
        }
    }
    pub fn max_tokens(mut self, n: u32) -> Self { self.max_tokens = n; self }
    pub fn eos(mut self, t: i32) -> Self { self.eos_token_id = Some(t); self }
    pub fn priority(mut self, p: i32) -> Self { self.priority = p; self }
    pub fn arrival(mut self, t: f64) -> Self { self.arrival_time = t; self }
    pub fn flags(mut self, f: u32) -> Self { self.flags |= f; self }
}

unsafe fn slice<'a, T>(p: *const T, n: u32) -> &'a [T] {
    if n == 0 || p.is_null() { &[] } else { std::slice::from_raw_parts(p, n as usize) }
}

/// One step's schedule: slices into the scheduler's arrays, valid while the borrow of the
/// scheduler lasts (until the next step, reset or drop).
pub struct Batch<'a> {
    raw: &'a ffi::tdm_batch,
}

/// One scheduled request of a [`Batch`].
#[derive(Clone, Copy, Debug)]
pub struct BatchEntry<'a> {
    pub req_id: u64,
    pub num_tokens: u32,
    pub num_computed: u32,
    pub kind: EntryKind,
    pub num_spec: u32,
    pub blocks: &'a [u32],
}

impl<'a> Batch<'a> {
    pub fn step(&self) -> u64 { self.raw.step }
    pub fn len(&self) -> usize { self.raw.num_reqs as usize }
    pub fn is_empty(&self) -> bool { self.raw.num_reqs == 0 }
    pub fn total_tokens(&self) -> u32 { self.raw.total_tokens }
    pub fn num_prefill_reqs(&self) -> u32 { self.raw.num_prefill_reqs }
    pub fn req_ids(&self) -> &'a [u64] { unsafe { slice(self.raw.req_ids, self.raw.num_reqs) } }
    pub fn num_tokens(&self) -> &'a [u32] { unsafe { slice(self.raw.num_tokens, self.raw.num_reqs) } }
    pub fn num_computed(&self) -> &'a [u32] { unsafe { slice(self.raw.num_computed, self.raw.num_reqs) } }
    pub fn kinds(&self) -> &'a [u8] { unsafe { slice(self.raw.kinds, self.raw.num_reqs) } }
    pub fn num_spec(&self) -> &'a [u32] { unsafe { slice(self.raw.num_spec, self.raw.num_reqs) } }
    pub fn block_offsets(&self) -> &'a [u32] {
        if self.raw.num_reqs == 0 { return &[]; }
        unsafe { slice(self.raw.block_offsets, self.raw.num_reqs + 1) }
    }
    pub fn blocks(&self) -> &'a [u32] {
        let offs = self.block_offsets();
        match offs.last() {
            Some(&n) => unsafe { slice(self.raw.blocks, n) },
            None => &[],
        }
    }
    pub fn preempted(&self) -> &'a [u64] { unsafe { slice(self.raw.preempted_ids, self.raw.num_preempted) } }
    pub fn finished(&self) -> &'a [u64] { unsafe { slice(self.raw.finished_ids, self.raw.num_finished) } }
    pub fn recv_ready(&self) -> &'a [u64] { unsafe { slice(self.raw.recv_ready_ids, self.raw.num_recv_ready) } }

    /// The i-th entry.
    pub fn entry(&self, i: usize) -> BatchEntry<'a> {
        let offs = self.block_offsets();
        let kind = match self.kinds()[i] {
            0 => EntryKind::New,
            1 => EntryKind::Resumed,
            _ => EntryKind::Continuing,
        };
        BatchEntry {
            req_id: self.req_ids()[i],
            num_tokens: self.num_tokens()[i],
            num_computed: self.num_computed()[i],
            kind,
            num_spec: self.num_spec()[i],
            blocks: &self.blocks()[offs[i] as usize..offs[i + 1] as usize],
        }
    }

    pub fn entries(&self) -> impl Iterator<Item = BatchEntry<'a>> + '_ {
        (0..self.len()).map(move |i| self.entry(i))
    }
}

/// What an update did (slices valid while the borrow of the scheduler lasts).
pub struct UpdateResult<'a> {
    raw: &'a ffi::tdm_update_result,
}

impl<'a> UpdateResult<'a> {
    pub fn len(&self) -> usize { self.raw.num_reqs as usize }
    pub fn is_empty(&self) -> bool { self.raw.num_reqs == 0 }
    pub fn req_ids(&self) -> &'a [u64] { unsafe { slice(self.raw.req_ids, self.raw.num_reqs) } }
    pub fn num_new_tokens(&self) -> &'a [u32] { unsafe { slice(self.raw.num_new_tokens, self.raw.num_reqs) } }
    pub fn finish_reasons(&self) -> Vec<FinishReason> {
        unsafe { slice(self.raw.finish_reasons, self.raw.num_reqs) }
            .iter().map(|&r| FinishReason::from_raw(r as u32)).collect()
    }
    pub fn stop_tokens(&self) -> &'a [i32] { unsafe { slice(self.raw.stop_tokens, self.raw.num_reqs) } }
}

/// An owned tdm_sched, destroyed on Drop.
pub struct Scheduler {
    raw: NonNull<ffi::tdm_sched>,
    batch: ffi::tdm_batch,
    result: ffi::tdm_update_result,
}

// The handle may move between threads; it is not Sync (no shared use).
unsafe impl Send for Scheduler {}

impl Drop for Scheduler {
    fn drop(&mut self) {
        unsafe { ffi::tdm_sched_destroy(self.raw.as_ptr()) }
    }
}

impl Scheduler {
    /// A scheduler with default parameters.
    pub fn new() -> Result<Scheduler> {
        check_abi()?;
        let mut p: *mut ffi::tdm_sched = ptr::null_mut();
        let rc = unsafe { ffi::tdm_sched_create(&mut p) };
        if rc != 0 {
            let m = unsafe { CStr::from_ptr(ffi::tdm_sched_errmsg(ptr::null())) };
            return Err(Error::new(rc, m.to_string_lossy().into_owned()));
        }
        let raw = NonNull::new(p).ok_or_else(|| Error::new(-21, "NULL handle".into()))?;
        let mut batch: ffi::tdm_batch = unsafe { std::mem::zeroed() };
        let mut result: ffi::tdm_update_result = unsafe { std::mem::zeroed() };
        unsafe {
            ffi::tdm_batch_init(&mut batch);
            ffi::tdm_update_result_init(&mut result);
        }
        Ok(Scheduler { raw, batch, result })
    }

    /// A scheduler configured from a JSON document (tdm_sched_configure keys).
    pub fn with_config(json: &str) -> Result<Scheduler> {
        let mut s = Scheduler::new()?;
        s.configure(json)?;
        Ok(s)
    }

    fn check(&self, rc: c_int) -> Result<()> {
        if rc == 0 {
            Ok(())
        } else {
            let m = unsafe { CStr::from_ptr(ffi::tdm_sched_errmsg(self.raw.as_ptr())) };
            Err(Error::new(rc, m.to_string_lossy().into_owned()))
        }
    }

    /// The raw handle (for other bindings); owned by self.
    pub fn as_ptr(&self) -> *mut ffi::tdm_sched { self.raw.as_ptr() }

    pub fn configure(&mut self, json: &str) -> Result<()> {
        let c = CString::new(json).map_err(|_| Error::new(status::INVAL, "NUL in JSON".into()))?;
        self.check(unsafe { ffi::tdm_sched_configure(self.raw.as_ptr(), c.as_ptr()) })
    }

    /// The full configuration as JSON text.
    pub fn config(&self) -> Result<String> {
        let mut len = 0usize;
        let rc = unsafe { ffi::tdm_sched_get_config(self.raw.as_ptr(), ptr::null_mut(), 0, &mut len) };
        if rc != 0 && rc != status::TRUNCATED {
            self.check(rc)?;
        }
        let mut buf = vec![0u8; len + 1];
        self.check(unsafe {
            ffi::tdm_sched_get_config(self.raw.as_ptr(), buf.as_mut_ptr() as *mut _, buf.len(), &mut len)
        })?;
        buf.truncate(len);
        String::from_utf8(buf).map_err(|_| Error::new(-21, "config is not UTF-8".into()))
    }

    pub fn set_param(&mut self, key: Param, value: i64) -> Result<()> {
        self.check(unsafe { ffi::tdm_sched_set_param(self.raw.as_ptr(), key as c_int, value) })
    }

    pub fn get_param(&self, key: Param) -> Result<i64> {
        let mut v = 0i64;
        self.check(unsafe { ffi::tdm_sched_get_param(self.raw.as_ptr(), key as c_int, &mut v) })?;
        Ok(v)
    }

    pub fn add(&mut self, r: &Request<'_>) -> Result<()> {
        let mut d: ffi::tdm_request_desc = unsafe { std::mem::zeroed() };
        unsafe { ffi::tdm_request_desc_init(&mut d) };
        let len32 = |n: usize, what: &str| -> Result<u32> {
            u32::try_from(n).map_err(|_| Error::new(status::RANGE, format!("{what} too long")))
        };
        d.flags = r.flags;
        d.id = r.id;
        d.prompt = r.prompt.as_ptr();
        d.num_prompt_tokens = len32(r.prompt.len(), "prompt")?;
        d.max_tokens = r.max_tokens;
        d.min_tokens = r.min_tokens;
        d.eos_token_id = r.eos_token_id.unwrap_or(-1);
        d.stop_token_ids = if r.stop_token_ids.is_empty() { ptr::null() } else { r.stop_token_ids.as_ptr() };
        d.num_stop_token_ids = len32(r.stop_token_ids.len(), "stop_token_ids")?;
        d.priority = r.priority;
        d.arrival_time = r.arrival_time;
        d.ttft_slo = r.ttft_slo;
        d.tpot_slo = r.tpot_slo;
        d.cache_salt = if r.cache_salt.is_empty() { ptr::null() } else { r.cache_salt.as_ptr() as *const _ };
        d.cache_salt_len = len32(r.cache_salt.len(), "cache_salt")?;
        d.num_remote_tokens = r.num_remote_tokens;
        d.tenant = r.tenant;
        self.check(unsafe { ffi::tdm_sched_add(self.raw.as_ptr(), &d) })
    }

    pub fn abort(&mut self, id: u64) -> Result<()> {
        self.check(unsafe { ffi::tdm_sched_abort(self.raw.as_ptr(), id) })
    }

    pub fn finish(&mut self, id: u64, reason: FinishReason) -> Result<()> {
        self.check(unsafe { ffi::tdm_sched_finish(self.raw.as_ptr(), id, reason as c_int) })
    }

    /// Schedule one step at host time `now` (seconds).
    pub fn step(&mut self, now: f64) -> Result<Batch<'_>> {
        let rc = unsafe { ffi::tdm_sched_step(self.raw.as_ptr(), now, &mut self.batch) };
        self.check(rc)?;
        Ok(Batch { raw: &self.batch })
    }

    /// Report a step's sampled tokens: (request id, tokens) pairs, each reporting that
    /// request's oldest unreported step (`tdm_sched_update`). A request left out stays owed:
    /// list every scheduled request, with no tokens for a prompt chunk that did not finish the
    /// prompt. A host that lists only the requests that sampled uses `update_step`.
    pub fn update(&mut self, outputs: &[(u64, &[i32])], now: f64) -> Result<UpdateResult<'_>> {
        self.report(None, outputs, now)
    }

    /// Report the whole batch of step `step` (`Batch::step`, `tdm_sched_update_step`): a
    /// request of that batch left out of `outputs` reports no tokens (vLLM's
    /// update_from_output). Batches are reported once each, oldest first; use this for every
    /// batch or for none.
    pub fn update_step(&mut self, step: u64, outputs: &[(u64, &[i32])], now: f64) -> Result<UpdateResult<'_>> {
        self.report(Some(step), outputs, now)
    }

    fn report(&mut self, step: Option<u64>, outputs: &[(u64, &[i32])], now: f64) -> Result<UpdateResult<'_>> {
        let ids: Vec<u64> = outputs.iter().map(|o| o.0).collect();
        let mut offs: Vec<u32> = Vec::with_capacity(outputs.len() + 1);
        let mut toks: Vec<i32> = Vec::new();
        offs.push(0);
        for (_, t) in outputs {
            toks.extend_from_slice(t);
            offs.push(u32::try_from(toks.len()).map_err(|_| Error::new(status::RANGE, "too many tokens".into()))?);
        }
        let mut o: ffi::tdm_step_output = unsafe { std::mem::zeroed() };
        unsafe { ffi::tdm_step_output_init(&mut o) };
        o.num_reqs = u32::try_from(ids.len()).map_err(|_| Error::new(status::RANGE, "too many outputs".into()))?;
        o.req_ids = ids.as_ptr();
        o.token_offsets = offs.as_ptr();
        o.tokens = toks.as_ptr();
        o.now = now;
        let rc = unsafe {
            match step {
                Some(st) => ffi::tdm_sched_update_step(self.raw.as_ptr(), st, &o, &mut self.result),
                None => ffi::tdm_sched_update(self.raw.as_ptr(), &o, &mut self.result),
            }
        };
        self.check(rc)?;
        Ok(UpdateResult { raw: &self.result })
    }

    pub fn set_draft_tokens(&mut self, id: u64, tokens: &[i32]) -> Result<()> {
        self.check(unsafe {
            ffi::tdm_sched_set_draft_tokens(self.raw.as_ptr(), id, tokens.as_ptr(), tokens.len() as u32)
        })
    }

    pub fn request_info(&self, id: u64) -> Result<ffi::tdm_request_info> {
        let mut i = ffi::tdm_request_info::default();
        unsafe { ffi::tdm_request_info_init(&mut i) };
        self.check(unsafe { ffi::tdm_sched_request_info(self.raw.as_ptr(), id, &mut i) })?;
        Ok(i)
    }

    /// The request's block table (a copy).
    pub fn request_blocks(&self, id: u64) -> Result<Vec<u32>> {
        let mut p: *const u32 = ptr::null();
        let mut n = 0u32;
        self.check(unsafe { ffi::tdm_sched_request_blocks(self.raw.as_ptr(), id, &mut p, &mut n) })?;
        Ok(unsafe { slice(p, n) }.to_vec())
    }

    /// All token ids of the request (a copy).
    pub fn request_tokens(&self, id: u64) -> Result<Vec<i32>> {
        let mut p: *const i32 = ptr::null();
        let mut n = 0u32;
        self.check(unsafe { ffi::tdm_sched_request_tokens(self.raw.as_ptr(), id, &mut p, &mut n) })?;
        Ok(unsafe { slice(p, n) }.to_vec())
    }

    pub fn remote_kv_done(&mut self, id: u64, ok: bool, num_valid_tokens: u32) -> Result<()> {
        self.check(unsafe {
            ffi::tdm_sched_remote_kv_done(self.raw.as_ptr(), id, ok as c_int, num_valid_tokens)
        })
    }

    pub fn release(&mut self, id: u64) -> Result<()> {
        self.check(unsafe { ffi::tdm_sched_release(self.raw.as_ptr(), id) })
    }

    pub fn reset_prefix_cache(&mut self, reset_running: bool) -> Result<()> {
        self.check(unsafe { ffi::tdm_sched_reset_prefix_cache(self.raw.as_ptr(), reset_running as c_int) })
    }

    pub fn stats(&self) -> Result<ffi::tdm_sched_stats> {
        let mut s = ffi::tdm_sched_stats::default();
        unsafe { ffi::tdm_sched_stats_init(&mut s) };
        self.check(unsafe { ffi::tdm_sched_get_stats(self.raw.as_ptr(), &mut s) })?;
        Ok(s)
    }

    pub fn num_unfinished(&self) -> Result<u32> {
        let mut n = 0u32;
        self.check(unsafe { ffi::tdm_sched_num_unfinished(self.raw.as_ptr(), &mut n) })?;
        Ok(n)
    }
}
