"""The Scheduler wrapper driven through the real library (skipped while the loaded library
does not implement tdm_sched_*)."""
import json

import pytest

import tandem
from tandem import EntryKind, FinishReason, Request, RequestState, Status, TandemError


def run_to_completion(s, token=7, max_steps=1000, now0=0.0):
    """Drive s like a host: step, 'run the model', report one token for every request whose
    prompt is complete after this step. Returns {id: [output tokens]}."""
    outs = {}
    t = now0
    for _ in range(max_steps):
        if s.num_unfinished() == 0:
            return outs
        t += 0.01
        b = s.step(now=t)
        report = {}
        for e in b:
            info = s.request_info(e.req_id)
            done_prompt = e.num_computed + e.num_tokens >= info.num_prompt_tokens + info.num_output_tokens
            report[e.req_id] = [token] if done_prompt else []
        t += 0.01
        r = s.update(report, now=t)
        for u in r:
            outs.setdefault(u.req_id, []).extend([token] * u.num_new_tokens)
    raise AssertionError("requests did not finish")


def test_scheduler__single_request_runs_to_length(sched):
    sched.add(Request(id=1, prompt=list(range(10)), max_tokens=3))
    b = sched.step(now=1.0)
    assert b.req_ids == [1]
    e = b.entries[0]
    assert e.kind == EntryKind.NEW and e.num_computed == 0 and e.num_tokens == 10
    assert len(e.blocks) == 3  # ceil(10 / 4)
    assert 0 not in e.blocks     # block 0 is the null block
    r = sched.update({1: [5]}, now=1.1)
    assert r.entries[0].num_new_tokens == 1 and r.entries[0].finish_reason == FinishReason.NONE
    outs = run_to_completion(sched, now0=2.0)
    info = sched.request_info(1)
    assert info.state == RequestState.FINISHED and info.finish_reason == FinishReason.LENGTH
    assert info.num_output_tokens == 3
    assert sched.request_tokens(1)[:10] == list(range(10))
    assert len(outs[1]) == 2


def test_scheduler__chunked_prefill_respects_budget(needs_scheduler):
    with tandem.Scheduler(block_size=4, num_blocks=64, max_num_batched_tokens=8,
                          max_num_seqs=4) as s:
        s.add(id=1, prompt=list(range(20)), max_tokens=1)
        b1 = s.step(now=0.0)
        assert b1.total_tokens == 8 and b1.entries[0].num_tokens == 8
        s.update({1: []})
        b2 = s.step(now=0.1)
        assert b2.entries[0].kind == EntryKind.CONTINUING
        assert b2.entries[0].num_computed == 8


def test_scheduler__eos_stops_and_frees_blocks(sched):
    total = sched.stats().num_free_blocks
    sched.add(Request(id=3, prompt=[1, 2, 3, 4, 5], max_tokens=50, eos_token_id=2))
    sched.step(now=0.0)
    r = sched.update({3: [2]}, now=0.1)
    assert r.finished == {3: FinishReason.STOP}
    assert r.entries[0].stop_token == 2
    sched.step(now=0.2)
    assert sched.num_unfinished() == 0
    assert sched.stats().num_free_blocks == total


def test_scheduler__duplicate_id_raises_exists_with_message(sched):
    sched.add(id=9, prompt=[1, 2, 3])
    with pytest.raises(TandemError) as ei:
        sched.add(id=9, prompt=[1, 2, 3])
    assert ei.value.status == Status.EXISTS
    assert ei.value.message  # the library's message, not empty
    assert sched.num_unfinished() == 1


def test_scheduler__unknown_id_raises_not_found(sched):
    with pytest.raises(TandemError) as ei:
        sched.abort(12345)
    assert ei.value.status == Status.NOT_FOUND


def test_scheduler__empty_prompt_is_invalid(sched):
    with pytest.raises(TandemError) as ei:
        sched.add(id=1, prompt=[])
    assert ei.value.status == Status.INVAL


def test_configure__unknown_key_names_key_and_changes_nothing(sched):
    before = sched.config
    with pytest.raises(TandemError) as ei:
        sched.configure({"max_num_seqs": 4, "no_such_key": 1})
    assert ei.value.status in (Status.CONFIG, Status.INVAL)
    assert "no_such_key" in ei.value.message
    assert sched.config == before


def test_config__round_trips(sched):
    cfg = sched.config
    assert cfg["block_size"] == 4 and cfg["num_blocks"] == 64
    assert sched.get_param("max_num_seqs") == 8
    sched.set_param(tandem.Param.MAX_NUM_SEQS, 5)
    assert sched.config["max_num_seqs"] == 5
    json.dumps(cfg)


def test_abort__frees_and_reports_finished(sched):
    free0 = sched.stats().num_free_blocks
    sched.add(id=1, prompt=list(range(9)), max_tokens=5)
    b = sched.step(now=0.0)
    assert b.req_ids == [1]
    sched.abort(1)
    b = sched.step(now=0.1)
    assert 1 in b.finished
    assert sched.stats().num_free_blocks == free0


def test_finish__host_reason_is_recorded(sched):
    sched.add(id=1, prompt=[1, 2, 3], max_tokens=5)
    sched.step(now=0.0)
    sched.update({1: [4]})
    sched.finish(1, "stop")
    assert sched.request_info(1).finish_reason == FinishReason.STOP


def test_many_requests__all_complete_and_no_block_leaks(sched):
    free0 = sched.stats().num_free_blocks
    for i in range(20):
        sched.add(id=100 + i, prompt=[(i * 7 + k) % 50 for k in range(5 + i)], max_tokens=4 + i % 3)
    outs = run_to_completion(sched)
    assert sorted(outs) == [100 + i for i in range(20)]
    for i in range(20):
        assert len(outs[100 + i]) == 4 + i % 3
    sched.step(now=1e6)
    st = sched.stats()
    assert st.num_running == 0 and st.num_waiting == 0
    assert st.num_free_blocks == free0
    assert st.finished == 20


def test_preemption__small_pool_still_completes(needs_scheduler):
    with tandem.Scheduler(block_size=4, num_blocks=12, max_num_batched_tokens=64,
                          max_num_seqs=8, enable_prefix_caching=0) as s:
        for i in range(4):
            s.add(id=i + 1, prompt=list(range(8)), max_tokens=12)
        outs = run_to_completion(s)
        assert all(len(outs[i + 1]) == 12 for i in range(4))
        assert s.stats().preemptions > 0


def test_prefix_cache__second_request_hits(sched):
    p = list(range(16))
    sched.add(id=1, prompt=p, max_tokens=1)
    run_to_completion(sched)
    sched.add(id=2, prompt=p, max_tokens=1)
    b = sched.step(now=10.0)
    e = b.entry(2)
    assert e.num_computed >= 12  # 3 of the 4 full blocks at least (last token recomputed)
    assert sched.stats().prefix_hits > 0


def test_remote_prefill__waits_then_runs(needs_scheduler):
    with tandem.Scheduler(block_size=4, num_blocks=64, role=tandem.Role.DECODE) as s:
        s.add(Request(id=5, prompt=list(range(10)), max_tokens=2, remote_prefill=True))
        b = s.step(now=0.0)
        assert 5 in b.recv_ready
        assert s.request_info(5).state == RequestState.WAITING_REMOTE_KV
        assert len(s.request_blocks(5)) == 3
        s.remote_kv_done(5, ok=True)
        b = s.step(now=0.1)
        e = b.entry(5)
        assert e is not None and e.num_computed == 9 and e.num_tokens == 1


def test_closed_scheduler__raises_state(needs_scheduler):
    s = tandem.Scheduler()
    s.close()
    s.close()
    with pytest.raises(TandemError) as ei:
        s.step()
    assert ei.value.status == Status.STATE


def test_update__malformed_report_is_rejected_without_change(sched):
    sched.add(id=1, prompt=[1, 2, 3], max_tokens=3)
    sched.step(now=0.0)
    # an unknown id is refused (TDM_E_STATE, naming it) and nothing else in the report applies
    with pytest.raises(TandemError) as ei:
        sched.update({1: [], 999: [1]})
    assert ei.value.status == Status.STATE and "999" in ei.value.message
    assert sched.request_info(1).num_output_tokens == 0
    r = sched.update({1: [4]})
    assert [u.req_id for u in r] == [1]
    # a replayed update (a host retrying) is refused: no second token
    with pytest.raises(TandemError) as ei:
        sched.update({1: [4]})
    assert ei.value.status == Status.STATE and "request 1" in ei.value.message
    assert sched.request_info(1).num_output_tokens == 1
    # a late output of a request aborted after it was scheduled is skipped, as in vLLM
    sched.step(now=0.1)
    sched.abort(1)
    assert [u.req_id for u in sched.update({1: [5]})] == []


def test_update__batch_report_takes_left_out_requests_as_no_tokens(needs_scheduler):
    """The issue-23 host: report only the requests that sampled a token, naming the batch
    (update(..., step=batch.step)); a prefill chunk left out reports nothing. Without step
    the per-request contract refuses the later token, naming the request and the remedy."""
    with tandem.Scheduler(block_size=16, num_blocks=64, max_num_seqs=4,
                          max_num_batched_tokens=32) as s:
        s.add(id=1, prompt=list(range(10, 80)), max_tokens=3)
        outs, t = [], 0.0
        for _ in range(20):
            if s.num_unfinished() == 0:
                break
            t += 0.01
            b = s.step(now=t)
            sampled = {e.req_id: [42] for e in b
                       if e.num_computed + e.num_tokens >= 70 + len(outs)}
            r = s.update(sampled, now=t + 0.005, step=b.step)
            outs.extend([42] * sum(u.num_new_tokens for u in r))
        assert s.num_unfinished() == 0 and outs == [42, 42, 42]
        # a request outside the named batch is refused, naming it
        s.add(id=2, prompt=[1, 2, 3], max_tokens=2)
        b = s.step(now=1.0)
        with pytest.raises(TandemError) as ei:
            s.update({5: [1]}, now=1.01, step=b.step)
        assert ei.value.status == Status.STATE
    with tandem.Scheduler(block_size=16, num_blocks=64, max_num_seqs=4,
                          max_num_batched_tokens=32) as s:
        s.add(id=1, prompt=list(range(10, 80)), max_tokens=3)
        s.step(now=0.0)
        s.update({}, now=0.01)             # the chunk left out: still owed
        s.step(now=0.02)
        s.step(now=0.03)                   # the prompt completes
        with pytest.raises(TandemError) as ei:
            s.update({1: [42]}, now=0.04)
        assert ei.value.status == Status.STATE
        assert "request 1" in ei.value.message and "tdm_sched_update_step" in ei.value.message


def test_draft_tokens__scheduled_and_verified(needs_scheduler):
    with tandem.Scheduler(block_size=4, num_blocks=64, num_lookahead_tokens=2,
                          max_num_seqs=4, max_num_batched_tokens=64) as s:
        s.add(id=1, prompt=[1, 2, 3, 4, 5], max_tokens=10)
        s.step(now=0.0)
        s.update({1: [6]})
        s.set_draft_tokens(1, [7, 8])
        b = s.step(now=0.1)
        e = b.entry(1)
        assert e.num_spec == 2 and e.num_tokens == 3
        r = s.update({1: [7, 9]})          # first draft accepted, second rejected
        assert r.entries[0].num_new_tokens == 2
        assert s.request_tokens(1)[-3:] == [6, 7, 9]
        with pytest.raises(TandemError) as ei:
            s.set_draft_tokens(1, [1, 2, 3])   # more than num_lookahead_tokens
        assert ei.value.status == Status.RANGE


def test_remote_decode__blocks_held_until_release(needs_scheduler):
    with tandem.Scheduler(block_size=4, num_blocks=64, role=tandem.Role.PREFILL) as s:
        free0 = s.stats().num_free_blocks
        s.add(Request(id=3, prompt=list(range(9)), max_tokens=1, remote_decode=True))
        s.step(now=0.0)
        r = s.update({3: [1]})
        assert r.finished == {3: FinishReason.LENGTH}
        s.step(now=0.1)
        assert s.request_info(3).state == RequestState.FINISHED_HELD
        assert s.stats().num_held == 1 and s.stats().num_free_blocks == free0 - 3
        s.release(3)
        assert s.stats().num_free_blocks == free0
        with pytest.raises(TandemError) as ei:
            s.release(3)
        assert ei.value.status in (Status.NOT_FOUND, Status.STATE)


def test_reset_prefix_cache__refused_while_running_unless_reset_running(sched):
    sched.add(id=1, prompt=list(range(8)), max_tokens=4)
    sched.step(now=0.0)
    with pytest.raises(TandemError) as ei:
        sched.reset_prefix_cache()
    assert ei.value.status == Status.STATE
    sched.reset_prefix_cache(reset_running=True)
    assert sched.request_info(1).state == RequestState.PREEMPTED


def test_set_policy__python_compare_orders_admission(needs_scheduler):
    with tandem.Scheduler(block_size=4, num_blocks=64, max_num_seqs=1,
                          max_num_batched_tokens=64) as s:
        seen = []

        def shortest_first(a, b):
            seen.append((a.id, b.id))
            return a.num_prompt_tokens - b.num_prompt_tokens

        s.set_policy(shortest_first, name="sjf")
        for rid, n in ((1, 30), (2, 10), (3, 20)):
            s.add(id=rid, prompt=list(range(n)), max_tokens=1, arrival_time=float(rid))
        order = []
        for t in range(20):
            b = s.step(now=10.0 + t)
            order += [e.req_id for e in b if e.kind == EntryKind.NEW]
            s.update({e.req_id: [1] for e in b})
            if s.num_unfinished() == 0:
                break
        assert order == [2, 3, 1]
        assert seen, "the Python compare was called"


def test_set_policy__refused_while_requests_wait(sched):
    sched.add(id=1, prompt=[1, 2, 3])
    with pytest.raises(TandemError) as ei:
        sched.set_policy(lambda a, b: 0)
    assert ei.value.status == Status.STATE


def test_block_hashes__host_digests_hit_across_requests_and_appended(sched):
    """Host digests (block_size 4 here) decide the prefix cache: equal digests hit, other
    tokens notwithstanding; a digest appended during decode caches the block it names."""
    h = [bytes([i + 1]) * 32 for i in range(4)]
    sched.add(Request(id=1, prompt=list(range(9)), max_tokens=4, block_hashes=h[:2]))
    t = 0.0
    appended = False
    while sched.num_unfinished():
        t += 0.01
        b = sched.step(now=t)
        rep = {}
        for e in b:
            info = sched.request_info(e.req_id)
            rep[e.req_id] = ([7] if e.num_computed + e.num_tokens >=
                             info.num_prompt_tokens + info.num_output_tokens else [])
        sched.update(rep, now=t + 0.005)
        info = sched.request_info(1)
        if not appended and info.num_prompt_tokens + info.num_output_tokens >= 12 \
                and info.state != RequestState.FINISHED:
            sched.append_block_hashes(1, [h[2]])   # block 2 (tokens 8..11) is full now
            appended = True
    assert appended
    sched.add(Request(id=2, prompt=list(range(100, 113)), max_tokens=1, block_hashes=h[:3]))
    assert sched.step(now=t + 1).entry(2).num_computed == 12
    sched.update({2: [7]}, now=t + 1.05)
    assert sched.num_unfinished() == 0


def test_block_hashes__validation_and_prefix_hash_key(sched):
    with pytest.raises(TandemError) as ei:
        sched.add(Request(id=1, prompt=list(range(9)), block_hashes=[b"x" * 8]))
    assert ei.value.status == Status.RANGE and "block_hash_size" in str(ei.value)
    with pytest.raises(ValueError):
        sched.add(Request(id=1, prompt=list(range(9)), block_hashes=[b"x" * 32, b"y" * 16]))
    with pytest.raises(ValueError):
        sched.add(Request(id=1, prompt=list(range(9)), block_hashes=[]))
    sched.add(Request(id=1, prompt=list(range(9)), block_hashes=[], block_hash_size=16))
    with pytest.raises(TandemError) as ei:
        sched.append_block_hashes(1, [b"z" * 32])
    assert ei.value.status == Status.INVAL and "differs" in str(ei.value)
    sched.append_block_hashes(1, [b"z" * 16, b"w" * 16])
    with pytest.raises(TandemError) as ei:
        sched.configure({"prefix_hash": "md5"})
    assert ei.value.status == Status.CONFIG and "prefix_hash" in str(ei.value)
    run_to_completion(sched)
    sched.step(now=100.0)  # reports (and drops) the finished request
    sched.configure({"prefix_hash": "xxh3_128"})
    assert sched.get_param(tandem.Param.PREFIX_HASH) == tandem.PrefixHash.XXH3_128


def test_kv_events__stored_removed_cleared_and_overflow(needs_scheduler):
    from tandem import KVEventKind
    with tandem.Scheduler(block_size=4, num_blocks=4, max_num_batched_tokens=64, max_num_seqs=8,
                          max_model_len=64, enable_kv_events=True, kv_events_capacity=16) as s:
        assert s.kv_events().events == []
        s.add(id=1, prompt=list(range(100, 109)), max_tokens=1)  # 2 full blocks
        run_to_completion(s)
        ev = s.kv_events().events
        assert [e.kind for e in ev] == [KVEventKind.STORED]
        st = ev[0]
        assert len(st.block_hashes) == 2 and all(len(h) == 32 for h in st.block_hashes)
        assert st.parent_block_hash is None and st.req_id == 1 and st.first_block == 0
        assert st.token_ids == list(range(100, 108)) and st.block_size == 4
        s.add(id=2, prompt=list(range(200, 209)), max_tokens=1)  # evicts both cached blocks
        run_to_completion(s)
        ev = s.kv_events().events
        assert [e.kind for e in ev] == [KVEventKind.REMOVED, KVEventKind.REMOVED, KVEventKind.STORED]
        assert {ev[0].block_hashes[0], ev[1].block_hashes[0]} == set(st.block_hashes)
        s.reset_prefix_cache()
        assert [e.kind for e in s.kv_events().events] == [KVEventKind.ALL_CLEARED]
        s.set_param("kv_events_capacity", 1)
        s.add(id=3, prompt=list(range(300, 309)), max_tokens=1)
        run_to_completion(s)
        b = s.kv_events()
        assert b.overflowed and b.num_dropped == 1 and len(b.events[0].block_hashes) == 1
        assert s.stats().kv_events_dropped == 1


class _NoIterArray(__import__("array").array):
    """An int32 array that refuses per-token reads: the binding must hand its buffer over."""

    def __iter__(self):
        raise AssertionError("the prompt was read token by token")

    def __getitem__(self, i):
        raise AssertionError("the prompt was read token by token")


def test_scheduler__int32_array_prompt_is_passed_as_a_buffer(sched):
    prompt = _NoIterArray("i", range(100, 110))
    sched.add(Request(id=1, prompt=prompt, max_tokens=2))
    assert sched.request_tokens(1) == list(range(100, 110))
    assert sched.step(now=1.0).entries[0].num_tokens == 10


def test_scheduler__prefix_hit_limit_bounds_the_hit(sched):
    p = list(range(200, 213))              # 3 full blocks of 4 and one token
    sched.add(Request(id=1, prompt=p, max_tokens=1))
    run_to_completion(sched)
    for rid, limit, hit in ((2, 9, 8), (3, 0, 0), (4, None, 12)):
        sched.add(Request(id=rid, prompt=p, max_tokens=1, prefix_hit_limit=limit))
        b = sched.step(now=10.0 + rid)
        assert b.entries[0].num_computed == hit, (limit, b.entries[0].num_computed)
        sched.update({rid: [5]}, now=10.5 + rid)
        run_to_completion(sched, now0=11.0 + rid)
