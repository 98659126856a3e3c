"""Loaders / writers of calibration inputs: vLLM benchmark JSON, power logs, profiles, params."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from carbon_gym._toml import load_toml
from carbon_gym.errors import DataError
from calibration.io import (
    SHIPPED_ATTENTION, SHIPPED_MLP_CSV, dump_params_toml, load_attention_anchors, load_bench_result,
    load_operator_profile, load_power_intervals, load_power_log, load_power_samples, write_attention_anchors,
    write_bench_result, write_power_log, write_power_samples,
)

DATA = Path(__file__).parent / "data"


def test_bench_result_hand_written_file():
    r = load_bench_result(DATA / "vllm_bench_llama8b_rate4.json")
    assert r.request_rate == 4.0 and r.burstiness == 1.0 and r.completed == 5
    assert r.input_lens.tolist() == [1021, 389, 1710, 77, 1006]  # the failed 6th request is left out
    assert r.output_lens.tolist() == [129, 4, 7, 1, 11]
    assert r.ttfts_s.tolist() == [0.1321, 0.0521, 0.1187, 0.0860, 0.0921]
    assert [len(x) for x in r.itls_s] == [128, 3, 6, 0, 10]
    tpot = r.tpots_s
    assert tpot[1] == pytest.approx((0.0135 + 0.0136 + 0.0137) / 3)
    # TPOT = sum(ITL) / (output - 1) = (latency - TTFT) / (output - 1), MLPerf's definition
    assert tpot[2] == pytest.approx((0.0280 + 0.0139 + 0.0140 + 0.0141 + 0.0139 + 0.0140) / 6)
    assert float(np.mean(tpot[r.output_lens > 1])) == pytest.approx(14.43e-3, abs=1e-5)  # the file's mean_tpot_ms
    assert tpot[3] == 0.0
    assert r.gpu_energy_j is None


def test_bench_result_round_trip(tmp_path):
    r = load_bench_result(DATA / "vllm_bench_llama8b_rate4.json")
    r2 = r.__class__(**{**r.__dict__, "gpu_energy_j": 1234.5})
    write_bench_result(tmp_path / "b.json", r2)
    back = load_bench_result(tmp_path / "b.json")
    assert back.request_rate == r.request_rate and back.gpu_energy_j == 1234.5
    for f in ("input_lens", "output_lens", "ttfts_s"):
        assert np.array_equal(getattr(back, f), getattr(r, f))
    assert all(np.array_equal(a, b) for a, b in zip(back.itls_s, r.itls_s))
    assert np.array_equal(back.tpots_s, r.tpots_s)


def test_bench_result_errors(tmp_path):
    f = tmp_path / "bad.json"
    f.write_text('{"request_rate": 1, "input_lens": [1], "output_lens": [2], "ttfts": [0.1]}')
    with pytest.raises(DataError, match="itls"):
        load_bench_result(f)
    f.write_text('{"request_rate": 1, "input_lens": [1, 2], "output_lens": [2], "ttfts": [0.1], "itls": [[]]}')
    with pytest.raises(DataError, match="output_lens"):
        load_bench_result(f)
    f.write_text("{not json")
    with pytest.raises(DataError, match="invalid JSON"):
        load_bench_result(f)
    f.write_text('{"request_rate": "inf", "input_lens": [5], "output_lens": [2], "ttfts": [0.1], "itls": [[0.01]]}')
    assert math.isinf(load_bench_result(f).request_rate)


def test_nvidia_smi_log_and_intervals():
    log = load_power_log(DATA / "nvidia_smi_power_log.csv")
    assert log.power_w.size == 24 and log.power_w[0] == 63.2 and log.power_w[-1] == 350.0
    assert np.diff(log.time_s) == pytest.approx(np.full(23, 0.25))
    assert set(log.gpu.tolist()) == {0}
    iv = load_power_intervals(DATA / "power_intervals.csv")
    assert iv.phase == ("idle", "decode", "prefill")
    assert iv.start_s[0] == pytest.approx(log.time_s[0])  # same clock as the log
    assert iv.end_s - iv.start_s == pytest.approx([1.875] * 3)


def test_power_log_and_samples_round_trip(tmp_path):
    t, g, p = [1.0, 1.05, 1.1], [0, 0, 1], [61.5, 250.25, 399.0]
    write_power_log(tmp_path / "p.csv", t, g, p)
    log = load_power_log(tmp_path / "p.csv")
    assert log.time_s.tolist() == t and log.gpu.tolist() == g and log.power_w.tolist() == p
    assert log.for_gpu(1).power_w.tolist() == [399.0]
    f = tmp_path / "s.csv"
    f.write_text("phase,prefill_tokens,n_decode,power_w\nidle,0,0,63\ndecode,0,8,196.5\n")
    s = load_power_samples(f)
    write_power_samples(tmp_path / "s2.csv", s)
    s2 = load_power_samples(tmp_path / "s2.csv")
    assert s2.phase == s.phase and np.array_equal(s2.power_w, s.power_w) and np.array_equal(s2.n_decode, s.n_decode)
    f.write_text("phase,prefill_tokens,n_decode,power_w\nidle,0,0,-3\n")
    with pytest.raises(DataError, match="power_w"):
        load_power_samples(f)
    (tmp_path / "n.csv").write_text("timestamp, power.draw [W]\n2025/03/12 10:20:00.000, [N/A]\n")
    with pytest.raises(DataError, match="not available"):
        load_power_log(tmp_path / "n.csv")


def test_shipped_profile_loads():
    prof = load_operator_profile(SHIPPED_MLP_CSV)
    assert sorted(prof) == [1, 2, 4, 8]
    p1 = prof[1]
    assert p1.tokens[0] == 1 and p1.tokens[-1] == 32768 and p1.tokens.size == 451  # 456 rows, repeated token counts merged by their median
    assert p1.shape["n_embd"] == 4096 and p1.shape["use_gated_mlp"] is True
    assert p1.ops_ms["mlp_up_proj"][0] == pytest.approx(0.142)
    a = load_attention_anchors(SHIPPED_ATTENTION)
    assert a.prefill_chunk.size == 26 and a.decode_batch.size == 15 and a.tp == 1
    assert math.isnan(a.decode_save_ms[9]) and a.decode_attn_ms[9] == 0.815


def test_anchors_round_trip(tmp_path):
    write_attention_anchors(tmp_path / "a.txt", [(64, 0, 0.011, 0.019)], [(8, 704, 0.035, float("nan"))], tp=4)
    a = load_attention_anchors(tmp_path / "a.txt")
    assert a.tp == 4 and a.prefill_attn_ms.tolist() == [0.011] and math.isnan(a.decode_save_ms[0])
    (tmp_path / "b.txt").write_text("# prefill: x\n64 0 0.01\n")
    with pytest.raises(DataError, match="4 columns"):
        load_attention_anchors(tmp_path / "b.txt")


def test_params_toml_round_trip(tmp_path):
    tables = {"latency": {"name": "x", "a": 0.1 + 0.2, "grid": [1.0, 2.5e-9], "n": 3, "s": 'quote " and \\'}}
    dump_params_toml(tmp_path / "p.toml", tables, ["header"])
    assert load_toml(tmp_path / "p.toml") == tables
    assert (tmp_path / "p.toml").read_text().startswith("# header\n")
