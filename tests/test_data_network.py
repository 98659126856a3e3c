"""Packaged network / PUE / zone data and the default topology built from them (issue 3)."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from carbon_gym._toml import data_path
from carbon_gym.errors import ConfigError, DataError
from carbon_gym.physics.network import METRO_RTT_MS, load_zone_rtt_ms, network_from_zones
from carbon_gym.scenario import DEFAULT_REGIONS, default_region_specs, default_topology, zone_table


def test_packaged_rtt_matrix_blank_and_diagonal_become_metro():
    zones, rtt = load_zone_rtt_ms()
    assert len(zones) == 18 and rtt.shape == (18, 18)
    assert np.all(np.isfinite(rtt)) and np.all(rtt > 0)
    assert np.all(np.diag(rtt) == METRO_RTT_MS)
    i, j = zones.index("US-MIDA-PJM"), zones.index("US-NY-NYIS")  # blank: same GCP region us-east4
    assert rtt[i, j] == METRO_RTT_MS and rtt[j, i] == METRO_RTT_MS
    assert rtt[zones.index("DE"), zones.index("FR")] == 10.0
    assert rtt[zones.index("AU-VIC"), zones.index("BR-CS")] == 306.0
    assert np.max(np.abs(rtt - rtt.T)) <= 2.0  # measured pairs are nearly symmetric


def test_network_one_way_is_half_rtt():
    net = network_from_zones(["DE", "JP-TK"], ["FR", "DE", "SG"])
    np.testing.assert_allclose(net.one_way_s * 1000, [[5.0, 4.0, 96.0], [112.0, 115.0, 34.5]])
    net2 = network_from_zones(["DE"], ["FR"], metro_rtt_ms=6.0, rtt_overrides_ms={0: [50.0]})
    assert net2.one_way_s[0, 0] == pytest.approx(0.025)


def test_network_unknown_zone_and_bad_override():
    with pytest.raises(ConfigError) as exc:
        network_from_zones(["DE"], ["ZA"])  # ZA has carbon data but no RTTs
    assert "ZA" in str(exc.value) and "allowed:" in str(exc.value)
    with pytest.raises(ConfigError, match=r"network.rtt_ms\[0\]"):
        network_from_zones(["DE"], ["FR", "DE"], rtt_overrides_ms={0: [1.0]})


def test_bad_rtt_file_names_line(tmp_path):
    p = tmp_path / "rtt.csv"
    p.write_text("from_zone,A,B\nA,0,-5\nB,5,0\n")
    with pytest.raises(DataError, match=r"rtt\.csv:2: negative RTT"):
        load_zone_rtt_ms(p)
    p.write_text("from_zone,A,B\nA,0,5\n")
    with pytest.raises(DataError, match="no row for zone"):
        load_zone_rtt_ms(p)
    p.write_text("from_zone,A,B\nA,0,5\nB,5,0\n")
    zones, rtt = load_zone_rtt_ms(p, metro_rtt_ms=3.0)
    assert zones == ("A", "B") and rtt.tolist() == [[3.0, 5.0], [5.0, 3.0]]


def test_zone_table_pue_comes_from_published_figures():
    table = zone_table()
    with open(data_path("pue", "cloud_provider_pue.csv"), newline="") as fh:
        published = {(r["location"], float(r["pue"])) for r in csv.DictReader(fh)}
        fh.seek(0)
        fleet = [float(r["pue"]) for r in csv.DictReader(fh) if r["provider"] == "google" and r["scope"] == "fleet"]
    with open(data_path("zones", "zones.csv"), newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["zone"] for r in rows} == set(table)
    for r in rows:
        pue = float(r["pue"])
        if r["pue_source_location"] == "global fleet average":
            assert pue == fleet[0]
        else:
            assert (r["pue_source_location"], pue) in published, r
    assert table["JP-TK"].pue == 1.12 and table["JP-TK"].utc_offset_h == 9
    assert table["IN-WE"].utc_offset_h == 5.5


def test_default_topology_is_the_study_topology():
    topo = default_topology()
    assert topo.n_regions == 4 and topo.n_datacenters == 16
    assert sum(d.gpus for d in topo.datacenters) == 512
    assert [d.zone for d in topo.datacenters] == [z for zs in DEFAULT_REGIONS.values() for z in zs]
    assert all(1.0 <= d.pue <= 1.2 for d in topo.datacenters)
    regions = default_region_specs()
    assert [r.client_zone for r in regions] == ["US-CAL-CISO", "DE", "JP-TK", "AU-NSW"]
    assert [r.utc_offset_h for r in regions] == [-8, 1, 9, 10]
    small = default_topology(nodes_per_datacenter=1, regions=["europe"], datacenters_per_region=2)
    assert [d.zone for d in small.datacenters] == ["DE", "GB"] and small.regions == ("europe",)
    with pytest.raises(ConfigError, match="only_regions"):
        default_topology(regions=["antarctica"])
