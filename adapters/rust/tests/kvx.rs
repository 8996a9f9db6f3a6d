//! Two transfer engines in one process over ipc: blocks pulled from one cache into the other,
//! every byte compared; errors carry the library's message.
#![allow(non_snake_case)]

use std::time::{Duration, Instant};
use tandem::{ffi, status, KvLayout, KvTransfer};

fn wait(k: &mut KvTransfer, handle: u64) -> tandem::KvEvent {
    let t0 = Instant::now();
    loop {
        assert!(t0.elapsed() < Duration::from_secs(10), "no event for handle {handle}");
        for e in k.poll(50).unwrap() {
            if e.handle == handle {
                return e;
            }
        }
    }
}

#[test]
fn kvx__structs_have_header_sizes() {
    assert_eq!(std::mem::size_of::<ffi::tdm_kv_layout>(), 64);
    assert_eq!(std::mem::size_of::<ffi::tdm_kvx_recv_desc>(), 48);
    assert_eq!(std::mem::size_of::<ffi::tdm_kvx_send_desc>(), 48);
    assert_eq!(std::mem::size_of::<ffi::tdm_kvx_event>(), 184);
    assert_eq!(std::mem::size_of::<ffi::tdm_kvx_stats>(), 88);
}

#[test]
fn kvx__pull_moves_every_byte() {
    let lay = KvLayout::new(1, 2, 16, 4, 2, 8, 1).unwrap();
    let ep = format!("ipc:///tmp/tandem-rust-kvx-{}.sock", std::process::id());
    let mut p = KvTransfer::from_json(&format!(
        r#"{{"engine_id": "rust-p", "role": "prefill", "listen": "{ep}", "heartbeat_ms": 50}}"#)).unwrap();
    let mut d = KvTransfer::from_json(r#"{"engine_id": "rust-d", "role": "decode"}"#).unwrap();
    p.register_host_cache(lay).unwrap();
    d.register_host_cache(lay).unwrap();
    let n = lay.layer_bytes();
    for layer in 0..2 {
        let data: Vec<u8> = (0..n).map(|i| ((i * 131 + layer * 17 + 3) & 0xff) as u8).collect();
        p.write(layer, 0, &data).unwrap();
    }
    let peer = d.connect(&p.endpoint().unwrap()).unwrap();
    let hs = p.send(77, &[2, 3, 9]).unwrap();
    let hr = d.recv(peer, 77, 1, &[5, 6, 7]).unwrap();
    let ev = wait(&mut d, hr);
    assert_eq!(ev.kind, tandem::kvx::EV_DONE, "{ev:?}");
    assert_eq!(ev.num_blocks_done, 3);
    assert_eq!(wait(&mut p, hs).kind, tandem::kvx::EV_DONE);
    let row = 2 * 8 * 2; // heads * head_dim * fp16
    for layer in 0..2 {
        for (s, t) in [(2u32, 5u32), (3, 6), (9, 7)] {
            for kv in 0..2 {
                for tok in 0..4 {
                    let mut a = vec![0u8; row];
                    let mut b = vec![0u8; row];
                    p.read(layer, lay.offset(kv, s, tok, 0), &mut a).unwrap();
                    d.read(layer, lay.offset(kv, t, tok, 0), &mut b).unwrap();
                    assert_eq!(a, b, "layer {layer} block {s}->{t} kv {kv} token {tok}");
                }
            }
        }
    }
    assert_eq!(d.stats().unwrap().num_reserved_blocks, 0);
    let e = d.recv(peer + 9, 1, 1, &[1]).unwrap_err();
    assert_eq!(e.status, status::PEER);
    assert!(!e.message.is_empty());
    let mut out = [0u8; 4];
    assert_eq!(d.read(2, 0, &mut out).unwrap_err().status, status::RANGE);
}

#[test]
fn kvx__bad_config_is_refused_with_the_key() {
    let e = KvTransfer::from_json(r#"{"engine_id": "x", "nope": 1}"#).err().expect("refused");
    assert!(e.message.contains("nope"), "{e}");
}
