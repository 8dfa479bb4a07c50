"""The GPU catalog (specter_lab.pricing.gpus) and hosts by their memory (specter_lab.pricing.hosts): every card has
its numbers and a source, names resolve the way people type them, and bad spellings get the closest valid ones."""

from __future__ import annotations

import json

import pytest

from specter_lab.pricing.gpus import CARDS, GPU_FAMILIES, find_gpu
from specter_lab.pricing.hosts import UNKNOWN_DESKTOP, calibrated_host, parse_host
from specter_lab.pricing.profiles import (DELIVERED_FRACTION, DELIVERED_FRACTION_RANGE, DRAM_MEASUREMENTS, HOSTS,
                                          get_profile, gpu_profile, resolve_gpu)

GiB = 2**30


def test_every_card_has_its_numbers_and_a_source():
    assert len(CARDS) >= 100
    for card in CARDS.values():
        assert card.vram_gb > 0 and card.bandwidth_gbs > 0 and card.tflops > 0, card
        if card.unified_memory:  # Apple: no link to cross
            assert (card.pcie_gen, card.pcie_lanes, card.link_raw) == (0, 0, 0.0), card
            assert card.vendor == "apple" and card.backends == ("metal",), card
        else:
            assert card.pcie_gen in (3, 4, 5) and card.pcie_lanes in (4, 8, 16), card
            assert card.link_raw > 0, card
        assert card.vendor in ("nvidia", "amd", "intel", "apple") and card.backends, card
        assert card.source.startswith("https://"), card
    # the families the issue names, with their memory variants
    for name in ("rtx3060", "rtx3060ti", "rtx4060", "rtx4060ti", "rtx4070", "rtx5060ti", "rtx5070", "rtx5080",
                 "rtx4090laptop", "rtxa4000", "rtxa5000", "rtxa6000", "l4", "l40s"):
        assert name in CARDS or name in GPU_FAMILIES, name
    assert {g.vram_gb for g in GPU_FAMILIES["rtx3060"]} == {12.0, 8.0}
    assert {g.vram_gb for g in GPU_FAMILIES["rtx4060ti"]} == {8.0, 16.0}


@pytest.mark.parametrize("card,bus,gbps", [("rtx3060-12gb", 192, 15), ("rtx3060-8gb", 128, 15),
                                           ("rtx4060ti-16gb", 128, 18), ("rtx5080", 256, 30), ("rtx3090", 384, 19.5),
                                           ("rx7900xtx", 384, 20), ("rx6800xt", 256, 16), ("rx9070xt", 256, 20),
                                           ("arcb580", 192, 19), ("arca770-16gb", 256, 17.5)])
def test_bandwidth_is_bus_width_times_data_rate(card, bus, gbps):
    assert CARDS[card].bandwidth_gbs == pytest.approx(bus / 8 * gbps)


def test_names_resolve_as_people_type_them():
    assert find_gpu("rtx3060").key == "rtx3060-12gb"  # the common variant first
    assert find_gpu("RTX 3060 8GB").key == "rtx3060-8gb"
    assert find_gpu("rtx3060", vram=8e9).key == "rtx3060-8gb"  # vram= picks the variant
    assert find_gpu("GeForce RTX 4060 Ti 16GB").key == "rtx4060ti-16gb"
    assert find_gpu("a4000").key == "rtxa4000" and find_gpu("4070 laptop").key == "rtx4070laptop"
    assert find_gpu("w7800").key == "radeonprow7800"


def test_other_vendors_resolve_as_people_type_them():
    assert find_gpu("rx7900xt").key == "rx7900xt" and find_gpu("RX 7900 XTX").key == "rx7900xtx"
    assert find_gpu("AMD Radeon RX 7800 XT").key == "rx7800xt" and find_gpu("9070 xt").key == "rx9070xt"
    assert find_gpu("RX 9060 XT 8GB").key == "rx9060xt-8gb" and find_gpu("w7900").key == "radeonprow7900"
    assert find_gpu("arc b580").key == "arcb580" and find_gpu("Intel Arc A770 8GB").key == "arca770-8gb"
    assert find_gpu("m2 max").key == "m2max-32gb" and find_gpu("M2 Max 96GB").key == "m2max-96gb"
    assert find_gpu("Apple M4 Max", vram=128e9).key == "m4max-128gb"
    # the x8 cards, and the Max bins whose memory size picks the bandwidth
    assert CARDS["rx7600xt"].pcie == "PCIe 4.0 x8" and CARDS["arcb580"].pcie_lanes == 8
    assert CARDS["m4max-36gb"].bandwidth_gbs == 410 and CARDS["m4max-48gb"].bandwidth_gbs == 546
    assert {g.vendor for g in CARDS.values()} == {"nvidia", "amd", "intel", "apple"}
    assert CARDS["rx6800"].tensor_cores is False and CARDS["rx7900xtx"].backends == ("rocm", "vulkan")


def test_unknown_names_get_the_closest_matches():
    with pytest.raises(ValueError, match=r"gpu='rtx3606' .*closest \['rtx3060'"):
        find_gpu("rtx3606")


def test_a_card_becomes_a_profile_the_engine_resolves():
    profile, card = resolve_gpu("rtx5060ti")
    assert card.pcie == "PCIe 5.0 x8" and profile.hbm_datasheet == pytest.approx(448e9)
    assert profile.pcie_bandwidth == pytest.approx(8 * 3.938e9 * 0.78)  # x8: half a x16 link
    assert get_profile(profile.name) == profile
    assert get_profile(profile.name + "+ddr5-5600x2").cpu_mem_bandwidth == pytest.approx(
        parse_host("ddr5-5600x2").dram_delivered)
    assert gpu_profile(CARDS["rtx2080"]).name == "rtx2080-pcie3"  # the published rows' hand-set profile


def test_delivered_fraction_comes_from_several_cited_measurements():
    assert len(DRAM_MEASUREMENTS) >= 3 and all(m.source for m in DRAM_MEASUREMENTS)
    fractions = [m.fraction for m in DRAM_MEASUREMENTS]
    assert DELIVERED_FRACTION_RANGE == (min(fractions), max(fractions))
    assert min(fractions) < DELIVERED_FRACTION < max(fractions)


def test_a_host_is_its_memory():
    h = parse_host("ddr5-5600x2")
    assert h.dram_peak == pytest.approx(5600e6 * 8 * 2)
    assert h.dram_delivered == pytest.approx(h.dram_peak * DELIVERED_FRACTION)
    lo, hi = h.delivered_band
    assert lo < h.dram_delivered < hi
    assert parse_host("ddr4-3200x4").dram_peak == pytest.approx(2 * parse_host("ddr4-3200x2").dram_peak)
    assert parse_host(45.0).dram_delivered == parse_host("45GB/s").dram_delivered == pytest.approx(45e9)
    assert parse_host("i9-10900x") is HOSTS["i9-10900x-ddr4-2933"]
    assert parse_host(None) is None
    lo, hi = UNKNOWN_DESKTOP.delivered_band  # not given: the whole desktop range
    assert lo < parse_host("ddr4-2666x2").dram_delivered and hi > parse_host("ddr5-6400x2").dram_delivered


@pytest.mark.parametrize("bad,match", [("ddr4-3100x2", r"nearest \['ddr4-3000x2', 'ddr4-3200x2'"),
                                       ("ddr5-5600x32", "channels"), ("pentium", "closest"),
                                       (-3.0, "positive GB/s")])
def test_bad_host_spellings_name_the_argument_and_valid_values(bad, match):
    with pytest.raises(ValueError, match=match) as err:
        parse_host(bad)
    assert "host=" in str(err.value)


def test_calibrated_host_file_is_read(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTER_LAB_PROFILES", str(tmp_path))
    with pytest.raises(ValueError, match="calibrate --host"):
        parse_host("calibrated")
    (tmp_path / "host.json").write_text(json.dumps({"dram_bandwidth": 31.5e9, "dram_threads": 8,
                                                    "dram_bytes": 256 << 20, "cores": 8}))
    h = parse_host("calibrated")
    assert h.dram_delivered == pytest.approx(31.5e9) and h.cores == 8 and "calibrate --host" in h.source
    assert calibrated_host(tmp_path / "host.json").dram_delivered == h.dram_delivered


def test_cli_calibrate_host_writes_what_the_estimate_reads(tmp_path, monkeypatch, capsys):
    from specter_lab.cli import main

    monkeypatch.setenv("SPECTER_LAB_PROFILES", str(tmp_path))
    assert main(["calibrate", "--host", "--hidden", "256", "--intermediate", "128"]) == 0
    assert "--host calibrated" in capsys.readouterr().out
    h = parse_host("calibrated")
    assert h.dram_delivered > 1e8 and h.name == "calibrated"
