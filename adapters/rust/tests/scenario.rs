//! A scheduling scenario through the real libtandem: requests added, stepped and updated to
//! completion, errors carrying the library's message, no block leaked.
#![allow(non_snake_case)]

use tandem::{ffi, status, EntryKind, FinishReason, Param, Request, Scheduler};

fn small() -> Scheduler {
    Scheduler::with_config(
        r#"{"block_size": 4, "num_blocks": 64, "max_num_batched_tokens": 32, "max_num_seqs": 8}"#,
    )
    .expect("scheduler")
}

#[test]
fn abi__matches_and_structs_have_header_sizes() {
    tandem::check_abi().unwrap();
    assert_eq!(tandem::version().split('.').count(), 3);
    assert_eq!(std::mem::size_of::<ffi::tdm_request_desc>(), 128);
    assert_eq!(std::mem::size_of::<ffi::tdm_batch>(), 128);
    assert_eq!(std::mem::size_of::<ffi::tdm_step_output>(), 40);
    assert_eq!(std::mem::size_of::<ffi::tdm_update_result>(), 40);
    assert_eq!(std::mem::size_of::<ffi::tdm_request_info>(), 88);
    assert_eq!(std::mem::size_of::<ffi::tdm_sched_stats>(), 104);
}

#[test]
fn scheduler__requests_run_to_completion_without_leaks() {
    let mut s = small();
    let free0 = s.stats().unwrap().num_free_blocks;
    let prompts: Vec<Vec<i32>> = (0..6).map(|i| (0..(5 + 3 * i)).collect()).collect();
    for (i, p) in prompts.iter().enumerate() {
        s.add(&Request::new(i as u64 + 1, p).max_tokens(3 + i as u32 % 2).arrival(0.0)).unwrap();
    }
    let mut produced = vec![0u32; 7];
    let mut t = 0.0;
    for _ in 0..200 {
        if s.num_unfinished().unwrap() == 0 {
            break;
        }
        t += 0.01;
        let mut report: Vec<(u64, Vec<i32>)> = Vec::new();
        let entries: Vec<(u64, u32, u32, EntryKind, usize)> = {
            let b = s.step(t).unwrap();
            assert!(b.total_tokens() <= 32);
            assert_eq!(b.num_tokens().iter().sum::<u32>(), b.total_tokens());
            b.entries().map(|e| (e.req_id, e.num_tokens, e.num_computed, e.kind, e.blocks.len())).collect()
        };
        for (id, n, comp, kind, nblocks) in entries {
            let info = s.request_info(id).unwrap();
            if kind == EntryKind::New {
                assert_eq!(comp % 4, 0); // a prefix-cache hit covers whole blocks
                assert!(nblocks >= 1);
            }
            let done = comp + n >= info.num_prompt_tokens + info.num_output_tokens;
            report.push((id, if done { vec![11] } else { vec![] }));
        }
        let refs: Vec<(u64, &[i32])> = report.iter().map(|(i, v)| (*i, v.as_slice())).collect();
        let r = s.update(&refs, t + 0.005).unwrap();
        for (id, n) in r.req_ids().iter().zip(r.num_new_tokens()) {
            produced[*id as usize] += n;
        }
    }
    for i in 0..6u64 {
        assert_eq!(produced[i as usize + 1], 3 + i as u32 % 2, "request {}", i + 1);
        let info = s.request_info(i + 1);
        if let Ok(info) = info {
            assert_eq!(FinishReason::from_raw(info.finish_reason), FinishReason::Length);
        }
    }
    s.step(t + 1.0).unwrap();
    let st = s.stats().unwrap();
    assert_eq!(st.num_running + st.num_waiting, 0);
    assert_eq!(st.num_free_blocks, free0);
    assert_eq!(st.finished, 6);
}

#[test]
fn add__duplicate_id_carries_library_message() {
    let mut s = small();
    let p = [1, 2, 3];
    s.add(&Request::new(5, &p)).unwrap();
    let e = s.add(&Request::new(5, &p)).unwrap_err();
    assert_eq!(e.status, status::EXISTS);
    assert!(!e.message.is_empty());
    assert_eq!(s.num_unfinished().unwrap(), 1);
}

#[test]
fn configure__unknown_key_is_refused_and_named() {
    let mut s = small();
    let before = s.config().unwrap();
    let e = s.configure(r#"{"no_such_key": 3}"#).unwrap_err();
    assert!(e.status == status::CONFIG || e.status == status::INVAL, "{e}");
    assert!(e.message.contains("no_such_key"), "{e}");
    assert_eq!(s.config().unwrap(), before);
    s.set_param(Param::MaxNumSeqs, 3).unwrap();
    assert_eq!(s.get_param(Param::MaxNumSeqs).unwrap(), 3);
}

#[test]
fn abort__unknown_id_is_not_found() {
    let mut s = small();
    let e = s.abort(99).unwrap_err();
    assert_eq!(e.status, status::NOT_FOUND);
}

#[test]
fn request_tokens__prompt_then_outputs() {
    let mut s = small();
    let p = [4, 5, 6];
    s.add(&Request::new(1, &p).max_tokens(2)).unwrap();
    assert_eq!(s.step(0.0).unwrap().req_ids(), &[1]);
    s.update(&[(1, &[9][..])], 0.1).unwrap();
    assert_eq!(s.request_tokens(1).unwrap(), vec![4, 5, 6, 9]);
    assert_eq!(s.request_blocks(1).unwrap().len(), 1);
}

#[test]
fn update_step__left_out_prefill_chunks_report_no_tokens() {
    // 40 prompt tokens in 32-token steps: the first chunk samples nothing and is left out.
    let mut s = small();
    let p: Vec<i32> = (10..50).collect();
    s.add(&Request::new(1, &p).max_tokens(2)).unwrap();
    let step = s.step(0.0).unwrap().step();
    s.update_step(step, &[], 0.01).unwrap();
    let step = s.step(0.02).unwrap().step();
    let r = s.update_step(step, &[(1, &[9][..])], 0.03).unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!(s.request_tokens(1).unwrap().len(), 41);
    // the same batch again: refused, naming the step
    match s.update_step(step, &[(1, &[9][..])], 0.04) {
        Err(e) => assert_eq!(e.status, status::STATE, "{e}"),
        Ok(_) => panic!("a batch reported twice was accepted"),
    }
}
