"""TableLatencyModel: functional form, the affine-in-context contract, shipped parameter files."""

from __future__ import annotations

import numpy as np
import pytest

from carbon_gym.errors import ConfigError, DataError
from carbon_gym.physics.latency import TableLatencyModel, load_latency_model

SHIPPED = [("llama-3.1-8b", 1), ("llama-3.1-8b", 2), ("llama-3.1-8b", 4), ("qwen2.5-7b", 1), ("mixtral-8x7b", 4)]


def _model(**kw) -> TableLatencyModel:
    base = dict(name="t", tokens_grid=[1.0, 100.0, 1000.0], linear_s=[0.01, 0.02, 0.11], overhead_s=0.002,
                per_sampled_seq_s=1e-5, attn_decode_per_seq_s=2e-6, attn_decode_per_ctx_s=1e-7,
                attn_prefill_per_token_s=3e-6, attn_prefill_per_pair_s=4e-9, allreduce_fixed_s=5e-4,
                allreduce_per_token_s=1e-6, lm_head_fixed_s=6e-4, attn_decode_fixed_s=7e-4, attn_prefill_fixed_s=8e-4)
    base.update(kw)
    return TableLatencyModel(**base)


def test_iteration_time_analytic():
    m = _model()
    # mixed batch: 50 prefill tokens (pairs 2000), 10 decodes (ctx 5000), 11 sampled; 60 tokens in the table
    lin = 0.01 + (0.02 - 0.01) * (60 - 1) / 99
    want = (0.002 + 6e-4 + 11 * 1e-5 + lin + 7e-4 + 10 * 2e-6 + 5000 * 1e-7 + 8e-4 + 50 * 3e-6 + 2000 * 4e-9
            + 5e-4 + 60 * 1e-6)
    assert m.iteration_time_s(50, 2000.0, 10, 5000.0, 11) == pytest.approx(want, rel=1e-12)
    # kernel part excludes overhead, LM head and all-reduce
    kern = lin + 7e-4 + 10 * 2e-6 + 5000 * 1e-7 + 8e-4 + 50 * 3e-6 + 2000 * 4e-9
    assert m.kernel_time_s(50, 2000.0, 10, 5000.0) == pytest.approx(kern, rel=1e-12)
    # no sampled sequence: no LM head
    assert m.iteration_time_s(50, 2000.0, 0, 0.0, 0) == pytest.approx(
        0.002 + lin - (0.02 - 0.01) * 10 / 99 + 8e-4 + 50 * 3e-6 + 2000 * 4e-9 + 5e-4 + 50e-6, rel=1e-12)
    assert m.iteration_time_s(0, 0.0, 0, 0.0, 0) == 0.0
    # linear extrapolation past the table's end
    assert m.linear_time_s(2000) == pytest.approx(0.11 + 0.09 / 900 * 1000)


@pytest.mark.parametrize("model,tp", SHIPPED)
def test_affine_in_decode_ctx_sum(model, tp):
    m = load_latency_model("a100-80gb", model, tp)
    rng = np.random.default_rng(0)
    for _ in range(20):
        p, n = int(rng.integers(0, 2048)), int(rng.integers(1, 256))
        pairs = p * (p + 1) / 2
        c0 = float(rng.integers(n, 100 * n))
        t0 = m.iteration_time_s(p, pairs, n, c0, n)
        for dc in (1.0, 17.0, 1000.0):
            assert m.iteration_time_s(p, pairs, n, c0 + dc, n) - t0 == pytest.approx(dc * m.decode_ctx_coeff_s(), rel=1e-9)


@pytest.mark.parametrize("model,tp", SHIPPED)
def test_shipped_files_load_and_are_sane(model, tp):
    m = load_latency_model("a100-80gb", model, tp)
    assert m.name == f"a100-80gb__{model}__tp{tp}"
    # measured dips (another kernel at one size) are kept: at most 20% below the running maximum (TP4 profile:
    # 16%), and the trend rises
    assert np.all(m.linear_s[1:] >= 0.8 * np.maximum.accumulate(m.linear_s)[:-1]) and m.linear_s[-1] > 10 * m.linear_s[0]
    # one decode step of a lone sequence: between the weights-read floor and 30 ms
    t1 = m.iteration_time_s(0, 0.0, 1, 1000.0, 1)
    assert 4e-3 < t1 < 30e-3
    assert m.iteration_time_s(0, 0.0, 64, 64000.0, 64) > t1
    assert (tp > 1) == (m.allreduce_fixed_s > 0)


def test_relations_between_shipped_models():
    l1, l4 = (load_latency_model("a100-80gb", "llama-3.1-8b", k) for k in (1, 4))
    mix = load_latency_model("a100-80gb", "mixtral-8x7b", 4)
    # Llama TP4 is faster than TP1; Mixtral (2 experts per token, > 2x weights read) slower than Llama TP4
    for p, n in [(0, 1), (0, 64), (2048, 0), (512, 32)]:
        a = l1.iteration_time_s(p, p * (p + 1) / 2, n, 1000.0 * n, max(n, 1))
        b = l4.iteration_time_s(p, p * (p + 1) / 2, n, 1000.0 * n, max(n, 1))
        c = mix.iteration_time_s(p, p * (p + 1) / 2, n, 1000.0 * n, max(n, 1))
        assert b < a and c > b


def test_bad_parameters_rejected(tmp_path):
    with pytest.raises(ConfigError, match="overhead_s"):
        _model(overhead_s=-1.0)
    with pytest.raises(ConfigError, match="tokens_grid"):
        _model(tokens_grid=[1.0, 1.0, 2.0])
    f = tmp_path / "x.toml"
    f.write_text('[latency]\nname = "x"\ntokens_grid = [1.0, 2.0]\nlinear_s = [0.1, 0.2]\nbogus = 1\n')
    with pytest.raises(DataError, match="bogus|missing"):
        TableLatencyModel.from_file(f)
    with pytest.raises(ConfigError, match="no latency parameters"):
        load_latency_model("a100-80gb", "qwen2.5-7b", 8)
