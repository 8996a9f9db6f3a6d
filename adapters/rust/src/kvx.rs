//! The KV transfer engine (tdm_kvx): an owned [`KvTransfer`] (destroyed on Drop) that owns its
//! host KV cache. The engine's I/O thread writes into the cache while receives run, so the
//! cache is never lent out as a Rust reference: [`KvTransfer::write`] and [`KvTransfer::read`]
//! copy bytes through raw pointers (read a received block after its DONE event).

use std::ffi::{CStr, CString};
use std::os::raw::c_void;
use std::ptr::{self, NonNull};

use crate::{ffi, status, Error, Result};

/// A paged KV cache layout (tdm_kv_layout).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvLayout {
    pub raw: ffi::tdm_kv_layout,
}

impl KvLayout {
    /// kind: 1 vLLM NHD, 2 vLLM HND, 3 FlashInfer; dtype: 1 fp16, 2 bf16, 3 fp32, 4 fp8.
    pub fn new(kind: i32, num_layers: u32, num_blocks: u32, block_size: u32, num_kv_heads: u32,
               head_dim: u32, dtype: i32) -> Result<KvLayout> {
        let mut raw = ffi::tdm_kv_layout::default();
        let rc = unsafe {
            ffi::tdm_kv_layout_init(&mut raw, kind, num_layers, num_blocks, block_size,
                                    num_kv_heads, head_dim, dtype)
        };
        if rc != 0 {
            return Err(Error::new(rc, "bad KV layout".into()));
        }
        Ok(KvLayout { raw })
    }

    pub fn elem_size(&self) -> usize { unsafe { ffi::tdm_dtype_size(self.raw.dtype as i32) } }

    /// Bytes of one layer's tensor.
    pub fn layer_bytes(&self) -> usize {
        let r = &self.raw;
        2 * r.num_blocks as usize * r.block_size as usize * r.num_kv_heads as usize
            * r.head_dim as usize * self.elem_size()
    }

    /// Byte offset of element (kv, block, token, head, 0) in a layer's tensor.
    pub fn offset(&self, kv: u32, block: u32, token: u32, head: u32) -> usize {
        let r = &self.raw;
        (kv as i64 * r.stride_kv + block as i64 * r.stride_block + token as i64 * r.stride_token
            + head as i64 * r.stride_head) as usize * self.elem_size()
    }
}

/// A completion event.
#[derive(Clone, Debug, PartialEq)]
pub struct KvEvent {
    pub kind: u32,      // 1 DONE, 2 FAILED, 3 CANCELLED
    pub side: u32,      // 1 send, 2 recv
    pub status: i32,
    pub handle: u64,
    pub request_id: u64,
    pub transfer_id: u64,
    pub peer: u32,
    pub num_blocks_done: u32,
    pub bytes: u64,
    pub reason: String,
}

pub const EV_DONE: u32 = 1;

/// An owned transfer engine with its host cache.
pub struct KvTransfer {
    raw: NonNull<ffi::tdm_kvx>,
    layout: Option<KvLayout>,
    layers: Vec<*mut u8>,
    _cache: Vec<Box<[u8]>>,
}

unsafe impl Send for KvTransfer {}

impl Drop for KvTransfer {
    fn drop(&mut self) {
        // The engine stops its I/O thread before the cache is dropped (field order).
        unsafe { ffi::tdm_kvx_destroy(self.raw.as_ptr()) }
    }
}

impl KvTransfer {
    /// An engine from a tdm_kvx_create_json document ({"engine_id": ..., "listen": ...}).
    pub fn from_json(json: &str) -> Result<KvTransfer> {
        crate::check_abi()?;
        let c = CString::new(json).map_err(|_| Error::new(status::INVAL, "NUL in JSON".into()))?;
        let mut p: *mut ffi::tdm_kvx = ptr::null_mut();
        let rc = unsafe { ffi::tdm_kvx_create_json(c.as_ptr(), &mut p) };
        if rc != 0 {
            let m = unsafe { CStr::from_ptr(ffi::tdm_kvx_errmsg(ptr::null())) };
            return Err(Error::new(rc, m.to_string_lossy().into_owned()));
        }
        let raw = NonNull::new(p).ok_or_else(|| Error::new(-21, "NULL handle".into()))?;
        Ok(KvTransfer { raw, layout: None, layers: Vec::new(), _cache: Vec::new() })
    }

    fn check(&self, rc: i32) -> Result<()> {
        if rc == 0 {
            return Ok(());
        }
        let m = unsafe { CStr::from_ptr(ffi::tdm_kvx_errmsg(self.raw.as_ptr())) };
        Err(Error::new(rc, m.to_string_lossy().into_owned()))
    }

    /// Allocate a zeroed host cache for `layout` and register it (once).
    pub fn register_host_cache(&mut self, layout: KvLayout) -> Result<()> {
        if self.layout.is_some() {
            return Err(Error::new(status::STATE, "a cache is already registered".into()));
        }
        let mut cache: Vec<Box<[u8]>> = (0..layout.raw.num_layers)
            .map(|_| vec![0u8; layout.layer_bytes()].into_boxed_slice()).collect();
        let layers: Vec<*mut u8> = cache.iter_mut().map(|b| b.as_mut_ptr()).collect();
        let bases: Vec<*mut c_void> = layers.iter().map(|&p| p as *mut c_void).collect();
        self.check(unsafe { ffi::tdm_kvx_register(self.raw.as_ptr(), &layout.raw, bases.as_ptr(), 0, 0) })?;
        self.layout = Some(layout);
        self.layers = layers;
        self._cache = cache;
        Ok(())
    }

    fn range(&self, layer: usize, offset: usize, len: usize) -> Result<*mut u8> {
        let lay = self.layout.ok_or_else(|| Error::new(status::STATE, "no cache registered".into()))?;
        if layer >= self.layers.len() || offset > lay.layer_bytes() || len > lay.layer_bytes() - offset {
            return Err(Error::new(status::RANGE, format!("bytes [{offset}, {}) of layer {layer} are outside the cache", offset + len)));
        }
        Ok(unsafe { self.layers[layer].add(offset) })
    }

    /// Copy `data` into layer `layer` at byte `offset`.
    pub fn write(&mut self, layer: usize, offset: usize, data: &[u8]) -> Result<()> {
        let p = self.range(layer, offset, data.len())?;
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
        Ok(())
    }

    /// Copy bytes of layer `layer` from `offset` into `out`.
    pub fn read(&self, layer: usize, offset: usize, out: &mut [u8]) -> Result<()> {
        let p = self.range(layer, offset, out.len())?;
        unsafe { ptr::copy_nonoverlapping(p as *const u8, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    pub fn endpoint(&self) -> Result<String> {
        let mut buf = vec![0u8; 512];
        self.check(unsafe { ffi::tdm_kvx_get_endpoint(self.raw.as_ptr(), buf.as_mut_ptr() as *mut _, buf.len()) })?;
        let n = buf.iter().position(|&c| c == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
    }

    pub fn connect(&mut self, endpoint: &str) -> Result<u32> {
        let c = CString::new(endpoint).map_err(|_| Error::new(status::INVAL, "NUL in endpoint".into()))?;
        let mut peer = 0u32;
        self.check(unsafe { ffi::tdm_kvx_connect(self.raw.as_ptr(), c.as_ptr(), ptr::null(), &mut peer) })?;
        Ok(peer)
    }

    /// Export a request's blocks (PULL: any peer may ask for them). Returns the handle.
    pub fn send(&mut self, request_id: u64, block_ids: &[u32]) -> Result<u64> {
        let mut d: ffi::tdm_kvx_send_desc = unsafe { std::mem::zeroed() };
        unsafe { ffi::tdm_kvx_send_desc_init(&mut d) };
        d.peer = ffi::TDM_KVX_PEER_ANY;
        d.num_blocks = block_ids.len() as u32;
        d.request_id = request_id;
        d.block_ids = block_ids.as_ptr();
        d.num_blocks_ready = block_ids.len() as u32;
        let mut h = 0u64;
        self.check(unsafe { ffi::tdm_kvx_send(self.raw.as_ptr(), &d, &mut h) })?;
        Ok(h)
    }

    /// Reserve `block_ids` and pull the request's blocks from `peer`. Returns the handle.
    pub fn recv(&mut self, peer: u32, request_id: u64, transfer_id: u64, block_ids: &[u32]) -> Result<u64> {
        let mut d: ffi::tdm_kvx_recv_desc = unsafe { std::mem::zeroed() };
        unsafe { ffi::tdm_kvx_recv_desc_init(&mut d) };
        d.peer = peer;
        d.num_blocks = block_ids.len() as u32;
        d.request_id = request_id;
        d.transfer_id = transfer_id;
        d.block_ids = block_ids.as_ptr();
        let mut h = 0u64;
        self.check(unsafe { ffi::tdm_kvx_recv(self.raw.as_ptr(), &d, &mut h) })?;
        Ok(h)
    }

    /// Completion events (waiting up to timeout_ms for the first).
    pub fn poll(&mut self, timeout_ms: i32) -> Result<Vec<KvEvent>> {
        let mut evs: Vec<ffi::tdm_kvx_event> = vec![unsafe { std::mem::zeroed() }; 32];
        unsafe { ffi::tdm_kvx_event_init(&mut evs[0]) };
        let size = evs[0].struct_size;
        for e in evs.iter_mut() {
            e.struct_size = size;
        }
        let mut n = 0u32;
        self.check(unsafe { ffi::tdm_kvx_poll(self.raw.as_ptr(), evs.as_mut_ptr(), 32, &mut n, timeout_ms) })?;
        Ok(evs[..n as usize].iter().map(|e| KvEvent {
            kind: e.type_, side: e.side, status: e.status, handle: e.handle,
            request_id: e.request_id, transfer_id: e.transfer_id, peer: e.peer,
            num_blocks_done: e.num_blocks_done, bytes: e.bytes,
            reason: unsafe { CStr::from_ptr(e.reason.as_ptr()) }.to_string_lossy().into_owned(),
        }).collect())
    }

    pub fn stats(&self) -> Result<ffi::tdm_kvx_stats> {
        let mut s = ffi::tdm_kvx_stats::default();
        unsafe { ffi::tdm_kvx_stats_init(&mut s) };
        self.check(unsafe { ffi::tdm_kvx_get_stats(self.raw.as_ptr(), &mut s) })?;
        Ok(s)
    }
}
