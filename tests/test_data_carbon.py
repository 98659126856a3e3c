"""Carbon-intensity loaders, validation, episode start and forecasts (issue 3)."""

from __future__ import annotations

import csv
import math
import warnings
from datetime import datetime

import numpy as np
import pytest

from carbon_gym._toml import data_path
from carbon_gym.errors import ConfigError, DataError
from carbon_gym.physics.carbon import (
    CarbonForecaster,
    CarbonTrace,
    carbon_offset_s,
    load_carbon_trace,
    packaged_carbon_zones,
)

DEFAULT_16 = ["US-CAL-CISO", "US-TEX-ERCO", "US-MIDA-PJM", "CA-ON", "DE", "GB", "FR", "NO",
              "JP-TK", "KR", "SG", "IN-WE", "AU-NSW", "AU-VIC", "BR-CS", "CL-SEN"]


def write(tmp_path, name: str, text: str):
    p = tmp_path / name
    p.write_text(text)
    return p


# ----------------------------------------------------------------------------- packaged


def test_packaged_lca_matches_provenance_means():
    trace = load_carbon_trace()
    assert trace.hours == 8760 and trace.start_utc == datetime(2023, 1, 1)
    assert trace.end_utc == datetime(2024, 1, 1)
    assert set(DEFAULT_16) <= set(trace.zones) and len(trace.zones) == 20
    assert trace.zones == packaged_carbon_zones()
    with open(data_path("carbon", "provenance_2023.csv"), newline="") as fh:
        prov = {r["zone"]: r for r in csv.DictReader(fh)}
    for z in trace.zones:
        col = trace.series(z)
        assert col.mean() == pytest.approx(float(prov[z]["ci_lca_mean"]), abs=0.06), z
        assert col.min() == pytest.approx(float(prov[z]["ci_lca_min"]), abs=0.006), z
        assert col.max() == pytest.approx(float(prov[z]["ci_lca_max"]), abs=0.006), z
    assert trace.filled_values == 0


def test_packaged_direct_is_below_lca_and_matches_provenance():
    lca = load_carbon_trace(kind="lca", zones=DEFAULT_16)
    direct = load_carbon_trace(kind="direct", zones=DEFAULT_16)
    assert direct.zones == tuple(DEFAULT_16) and direct.kind == "direct"
    assert np.all(direct.hourly_g_per_kwh <= lca.hourly_g_per_kwh + 1e-9)
    with open(data_path("carbon", "provenance_2023.csv"), newline="") as fh:
        prov = {r["zone"]: r for r in csv.DictReader(fh)}
    for z in DEFAULT_16:
        assert direct.series(z).mean() == pytest.approx(float(prov[z]["ci_direct_mean"]), abs=0.06)


def test_zone_selection_keeps_order_and_values():
    full = load_carbon_trace()
    sub = load_carbon_trace(zones=["NO", "DE"])
    assert sub.zones == ("NO", "DE")
    np.testing.assert_array_equal(sub.hourly_g_per_kwh[:, 0], full.series("NO"))
    np.testing.assert_array_equal(full.select(["DE"]).hourly_g_per_kwh[:, 0], full.series("DE"))


def test_unknown_zone_lists_available_zones():
    with pytest.raises(ConfigError) as exc:
        load_carbon_trace(zones=["DE", "XX-NOPE"])
    assert exc.value.field == "carbon.zones"
    assert "XX-NOPE" in str(exc.value) and "US-CAL-CISO" in str(exc.value)
    assert "electricitymaps_ci_lca_hourly_2023.csv" in str(exc.value)


# ----------------------------------------------------------------------------- user files


def test_wide_file_of_another_year_with_analytic_integrals(tmp_path):
    p = write(tmp_path, "wide.csv", "datetime_utc,AA,BB\n"
              "2021-03-01 00:00:00,100,10\n2021-03-01 01:00:00,200,20\n2021-03-01 02:00:00,300,30\n")
    step = load_carbon_trace(p)
    assert step.zones == ("AA", "BB") and step.start_utc == datetime(2021, 3, 1) and step.hours == 3
    assert step.intensity(0, 5400.0) == 200.0
    # step: integral over [1800, 5400] = 100*1800 + 200*1800
    assert step.integral(0, 1800.0, 5400.0) == pytest.approx(100 * 1800 + 200 * 1800)
    lin = load_carbon_trace(p, interpolation="linear")
    assert lin.intensity(1, 1800.0) == pytest.approx(15.0)
    # linear: exact trapezoid over the first two hours = (10+20)/2*3600 + (20+30)/2*3600
    assert lin.integral(1, 0.0, 7200.0) == pytest.approx(15 * 3600 + 25 * 3600)
    assert carbon_offset_s(step, "2021-03-01T01:30:00Z") == 5400.0


def test_leap_year_and_timezone_offsets(tmp_path):
    p = write(tmp_path, "tz.csv", "time,ZZ\n"
              "2024-02-28T23:00:00+01:00,1\n2024-02-29T00:00:00+01:00,2\n2024-02-29T00:00:00Z,3\n")
    t = load_carbon_trace(p)
    assert t.start_utc == datetime(2024, 2, 28, 22)  # +01:00 converted to UTC
    assert t.hours == 3 and list(t.series("ZZ")) == [1.0, 2.0, 3.0]
    # a leap day: 2024-02-28 00:00 .. 2024-03-01 23:00 is 72 hourly rows
    rows = ["datetime_utc,ZZ"] + [
        f"2024-{m:02d}-{d:02d} {h:02d}:00:00,{i}" for i, (m, d, h) in enumerate(
            [(2, 28, h) for h in range(24)] + [(2, 29, h) for h in range(24)] + [(3, 1, h) for h in range(24)])
    ]
    leap = load_carbon_trace(write(tmp_path, "leap.csv", "\n".join(rows) + "\n"))
    assert leap.hours == 72 and leap.end_utc == datetime(2024, 3, 2)
    assert carbon_offset_s(leap, "2024-02-29T12:00:00Z") == 36 * 3600.0
    # skipping the leap day is 24 missing hours, reported at the first row after the gap
    rows_noleap = [r for r in rows if "-02-29 " not in r]
    with pytest.raises(DataError) as exc:
        load_carbon_trace(write(tmp_path, "noleap.csv", "\n".join(rows_noleap) + "\n"))
    assert "noleap.csv:26:" in str(exc.value) and "24 missing hour(s)" in str(exc.value)


def test_long_format_generic_columns(tmp_path):
    rows = ["zone,datetime,value"]
    for z, base in (("X1", 10.0), ("X2", 50.0)):
        for h in range(4):
            rows.append(f"{z},2019-07-01 {h:02d}:00:00,{base + h}")
    t = load_carbon_trace(write(tmp_path, "long.csv", "\n".join(rows) + "\n"))
    assert t.zones == ("X1", "X2") and t.hours == 4 and t.start_utc == datetime(2019, 7, 1)
    np.testing.assert_array_equal(t.hourly_g_per_kwh, [[10, 50], [11, 51], [12, 52], [13, 53]])
    only = load_carbon_trace(tmp_path / "long.csv", zones=["X2"])
    assert only.zones == ("X2",) and only.series("X2")[-1] == 53


def test_long_format_electricity_maps_export_picks_kind_column(tmp_path):
    header = "Datetime (UTC),Country,Zone Name,Zone Id,Carbon Intensity gCO₂eq/kWh (direct),Carbon Intensity gCO₂eq/kWh (LCA),Data Estimated"
    lines = [header]
    for h in range(3):
        lines.append(f"2022-01-01 {h:02d}:00:00,Norway,Norway,NO,{10 + h},{30 + h},false")
    p = write(tmp_path, "NO_2022_hourly.csv", "\n".join(lines) + "\n")
    assert list(load_carbon_trace(p, kind="lca").series("NO")) == [30, 31, 32]
    assert list(load_carbon_trace(p, kind="direct").series("NO")) == [10, 11, 12]


def test_long_format_unsorted_within_zone_names_line(tmp_path):
    p = write(tmp_path, "long_bad.csv", "zone,datetime,value\nA,2023-01-01 00:00,1\nA,2023-01-01 02:00,2\nA,2023-01-01 01:00,3\n")
    with pytest.raises(DataError, match=r"long_bad\.csv:4: timestamps not sorted"):
        load_carbon_trace(p, fill="ffill")


def test_long_format_zone_with_fewer_hours_is_an_error(tmp_path):
    p = write(tmp_path, "ragged.csv", "zone,datetime,value\nA,2023-01-01 00:00,1\nA,2023-01-01 01:00,2\nB,2023-01-01 00:00,5\n")
    with pytest.raises(DataError, match="zone B has no value for 1 hour"):
        load_carbon_trace(p)


# ----------------------------------------------------------------------------- bad files


GOOD = "datetime_utc,A,B\n2023-01-01 00:00:00,1,2\n2023-01-01 01:00:00,3,4\n2023-01-01 02:00:00,5,6\n"


@pytest.mark.parametrize(
    "text, line, needle",
    [
        ("datetime_utc,A,B\n2023-01-01 00:00:00,1,2\n2023-01-01 03:00:00,3,4\n", 3, "2 missing hour(s)"),
        ("datetime_utc,A,B\n2023-01-01 00:00:00,1,2\n2023-01-01 01:00:00,-3,4\n", 3, "negative carbon intensity -3.0 for zone A"),
        ("datetime_utc,A,B\n2023-01-01 00:00:00,1,2\n2023-01-01 01:00:00,3,abc\n", 3, "zone B at 2023-01-01 01:00:00: not a number: 'abc'"),
        ("datetime_utc,A,B\n2023-01-01 01:00:00,1,2\n2023-01-01 00:00:00,3,4\n", 3, "timestamps not sorted"),
        ("datetime_utc,A,B\n2023-01-01 00:00:00,1,2\n2023-01-01 00:00:00,3,4\n", 3, "duplicate timestamp 2023-01-01 00:00:00 (also on line 2)"),
        ("datetime_utc,A,B\n2023-01-01 00:00:00,1,2\n2023-01-01 01:00:00,,4\n", 3, "missing value for zone A"),
        ("datetime_utc,A,B\n2023-01-01 00:00:00,1,2\n2023-01-01 00:30:00,3,4\n", 3, "not on the hourly grid"),
        ("datetime_utc,A,B\n2023-01-01 00:00:00,1,2\nyesterday,3,4\n", 3, "cannot parse timestamp 'yesterday'"),
        ("datetime_utc,A,B\n2023-01-01 00:00:00,1,2\n2023-01-01 01:00:00,3\n", 3, "expected 3 columns, got 2"),
        ("datetime_utc,A,B\n2023-01-01 00:00:00,1,inf\n", 2, "not a finite number"),
    ],
    ids=["missing-hour", "negative", "non-numeric", "unsorted", "duplicate", "empty", "off-grid", "bad-time", "short-row", "inf"],
)
def test_bad_carbon_files_name_file_and_line(tmp_path, text, line, needle):
    p = write(tmp_path, "bad.csv", text)
    with pytest.raises(DataError) as exc:
        load_carbon_trace(p)
    msg = str(exc.value)
    assert f"bad.csv:{line}:" in msg, msg
    assert needle in msg, msg


def test_zone_not_in_user_file_is_config_error(tmp_path):
    p = write(tmp_path, "good.csv", GOOD)
    with pytest.raises(ConfigError) as exc:
        load_carbon_trace(p, zones=["C"])
    assert "good.csv" in str(exc.value) and "allowed: A, B" in str(exc.value)


def test_missing_file_and_bad_options(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        load_carbon_trace(tmp_path / "nope.csv")
    with pytest.raises(ConfigError, match="carbon.kind"):
        load_carbon_trace(kind="scope3")
    with pytest.raises(ConfigError, match="carbon.interpolation"):
        load_carbon_trace(interpolation="cubic")
    with pytest.raises(ConfigError, match="carbon.fill"):
        load_carbon_trace(fill="zero")


def test_fill_is_opt_in_and_reported(tmp_path):
    p = write(tmp_path, "gappy.csv", "datetime_utc,A\n2023-01-01 00:00:00,10\n2023-01-01 03:00:00,40\n2023-01-01 04:00:00,\n2023-01-01 05:00:00,60\n")
    with pytest.raises(DataError):
        load_carbon_trace(p)
    with pytest.warns(UserWarning, match="filled 3 missing"):
        f = load_carbon_trace(p, fill="ffill")
    assert f.filled_values == 3 and list(f.series("A")) == [10, 10, 10, 40, 40, 60]
    with pytest.warns(UserWarning, match="filled 3 missing"):
        lin = load_carbon_trace(p, fill="linear")
    assert list(lin.series("A")) == [10, 20, 30, 40, 50, 60]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_carbon_trace(write(tmp_path, "ok.csv", GOOD), fill="ffill").filled_values == 0


def test_fill_does_not_hide_garbage(tmp_path):
    p = write(tmp_path, "garbage.csv", "datetime_utc,A\n2023-01-01 00:00:00,10\n2023-01-01 01:00:00,ten\n")
    with pytest.raises(DataError, match="garbage.csv:3"):
        load_carbon_trace(p, fill="ffill")


# ----------------------------------------------------------------------------- episode start


def test_episode_start_offsets_and_bounds():
    trace = load_carbon_trace(zones=["FR"])
    assert carbon_offset_s(trace, "2023-01-01T00:00:00Z") == 0.0
    assert carbon_offset_s(trace, "2023-06-15T12:00:00Z") == (31 + 28 + 31 + 30 + 31 + 14) * 86400 + 12 * 3600
    assert carbon_offset_s(trace, "2023-06-15T14:00:00+02:00") == carbon_offset_s(trace, "2023-06-15 12:00")
    assert carbon_offset_s(trace, datetime(2023, 12, 31, 23, 59)) == trace.period_s - 60
    for bad in ("2022-12-31T23:00:00Z", "2024-01-01T00:00:00Z"):
        with pytest.raises(ConfigError) as exc:
            carbon_offset_s(trace, bad)
        assert exc.value.field == "carbon.start_utc" and "outside the carbon trace" in str(exc.value)
    with pytest.raises(ConfigError, match="ISO-8601"):
        carbon_offset_s(trace, "June 15th")


# ----------------------------------------------------------------------------- forecasts


def test_perfect_forecast_equals_future_hours():
    trace = load_carbon_trace(zones=["DE", "NO"])
    f = CarbonForecaster(trace, horizon_h=6, error_std_frac=0.0)
    t = 10 * 3600 + 1234.0
    np.testing.assert_array_equal(f.forecast(t), trace.hourly_g_per_kwh[11:17])
    np.testing.assert_array_equal(f.forecast_times_s(t), np.arange(11, 17) * 3600.0)
    # wraps around the end of the year like CarbonTrace
    end = f.forecast(trace.period_s - 1800.0)
    np.testing.assert_array_equal(end, trace.hourly_g_per_kwh[:6])


def test_noisy_forecast_is_deterministic_and_grows_with_lead():
    trace = load_carbon_trace(zones=DEFAULT_16)
    a = CarbonForecaster(trace, horizon_h=16, error_std_frac=0.1, seed=7)
    b = CarbonForecaster(trace, horizon_h=16, error_std_frac=0.1, seed=7)
    times = [h * 3600.0 + 5.0 for h in range(0, 8000, 7)]
    fa = np.stack([a.forecast(t) for t in times])
    fb = np.stack([b.forecast(t) for t in reversed(times)])[::-1]  # call order does not matter
    np.testing.assert_array_equal(fa, fb)
    assert not np.array_equal(fa, np.stack([CarbonForecaster(trace, 16, 0.1, seed=8).forecast(t) for t in times]))
    truth = np.stack([a.actual(t) for t in times])
    log_err = np.log(fa / truth)
    std_by_lead = log_err.std(axis=(0, 2))
    n = log_err.shape[0] * log_err.shape[2]
    for k in (1, 4, 16):  # std of the log error = sigma * sqrt(k), within sampling error
        assert std_by_lead[k - 1] == pytest.approx(0.1 * math.sqrt(k), rel=4 / math.sqrt(2 * n) + 0.02)
    ratio = (fa / truth).mean(axis=(0, 2))  # unbiased multiplicative noise
    assert np.all(np.abs(ratio - 1) < 4 * 0.1 * np.sqrt(np.arange(1, 17)) / math.sqrt(n) + 0.01)
    assert np.all(fa > 0)


def test_forecaster_validates_arguments():
    trace = load_carbon_trace(zones=["FR"])
    with pytest.raises(ConfigError, match="forecast_horizon_h"):
        CarbonForecaster(trace, horizon_h=0)
    with pytest.raises(ConfigError, match="forecast_error_std_frac"):
        CarbonForecaster(trace, horizon_h=3, error_std_frac=-0.1)


def test_carbon_trace_class_api_unchanged():
    t = CarbonTrace(zones=("A",), start_utc=datetime(2023, 1, 1), hourly_g_per_kwh=np.array([[100.0], [300.0]]))
    assert t.integral(0, 0.0, 7200.0) == pytest.approx(100 * 3600 + 300 * 3600)
    assert t.mean_intensity(0, 0.0, 7200.0) == pytest.approx(200.0)
    assert t.intensity(0, 7200.0 + 10) == 100.0  # cyclic
    assert t.filled_values == 0
