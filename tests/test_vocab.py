"""The shared vocabulary (named payload types) and the coverage files."""

import json

import pytest

from elmoe3d.config import preset
from elmoe3d.hw import vocab as hv

pytestmark = pytest.mark.golden


def test_equal_configs_give_the_same_classes():
    a, b = hv.vocab(preset("tiny")), hv.vocab(preset("tiny").replace())
    assert a.SliceVector is b.SliceVector and a.FillBeat is b.FillBeat
    assert a.SliceVector.__name__ == "SliceVector"
    d = hv.vocab(preset("default"))
    assert d.SliceVector is not a.SliceVector


def test_field_words():
    v = hv.vocab(preset("tiny").replace(slice_bits=2, hb_words=8192))
    sv = v.SliceVector.as_shape()
    assert dict(sv)["plane"].shape.width == 2           # index of 4 planes
    assert dict(v.ExtCommand.as_shape())["plane_mask"].shape.width == 4    # a mask
    assert "planes" not in dict(v.ExtCommand.as_shape())
    assert dict(v.FillBeat.as_shape())["words"].shape.length == v.cfg.fill_words == 2


def test_coverage_merge_and_summary(tmp_path):
    from cocotb_coverage.coverage import CoverCross, CoverPoint
    from elmoe3d.tb.coverage import load_coverage, write_coverage

    @CoverPoint("blk_t.op", xf=lambda op, e: op, bins=["a", "b"])
    @CoverPoint("blk_t.err", xf=lambda op, e: e, bins=[0, 1])
    @CoverCross("blk_t.opXerr", items=["blk_t.op", "blk_t.err"])
    def sample(op, e):
        pass

    sample("a", 0)
    write_coverage("blk_t", run="one", transactions=1, directory=tmp_path)
    s = json.loads((tmp_path / "blk_t.json").read_text())["summary"]
    assert s["coverpoint_pct"] == 50.0 and s["cross_pct"] == 25.0 and not s["meets_bar"]
    assert s["coverpoints_missed"] == ["blk_t.err[1]", "blk_t.op[b]"]
    sample("b", 1)
    write_coverage("blk_t", run="two", transactions=1, directory=tmp_path)
    cov = load_coverage(tmp_path)["blk_t"]
    assert cov["summary"]["coverpoint_pct"] == 100.0 and cov["summary"]["transactions"] == 2
    assert len(cov["runs"]) == 2
    assert cov["coverpoints"]["blk_t.op"] == {"a": 1, "b": 1}     # no double counting


@pytest.mark.parametrize("knob", ["ELMOE_GOLDEN_MUTATION", "ELMOE_TAG_MUTANT"])
def test_mutant_runs_write_no_coverage(tmp_path, monkeypatch, knob):
    """A run against a mutated golden model (the tests that prove a
    scoreboard can fail) adds nothing to the coverage file (before: its bins
    and its transactions were counted)."""
    from cocotb_coverage.coverage import CoverPoint
    from elmoe3d.tb.coverage import load_coverage, write_coverage

    @CoverPoint(f"blk_m{knob[6]}.op", xf=lambda op: op, bins=["a", "b"])
    def sample(op):
        pass

    sample("a")
    monkeypatch.setenv(knob, "tie" if "TAG" in knob else "1")
    write_coverage(f"blk_m{knob[6]}", run="mutant", transactions=5, directory=tmp_path)
    assert not (tmp_path / f"blk_m{knob[6]}.json").exists()
    monkeypatch.setenv(knob, "0")
    write_coverage(f"blk_m{knob[6]}", run="real", transactions=1, directory=tmp_path)
    cov = load_coverage(tmp_path)[f"blk_m{knob[6]}"]
    assert cov["summary"]["transactions"] == 1 and [r["run"] for r in cov["runs"]] == ["real"]


def test_host_opcodes_are_shaped_enums_and_round_value_is_a_view():
    """HostOp is the ``op`` shape of HostCommand and HostResponse (TileOp
    shares its values); ROUND's value reads as RoundValue ``{batch, force}``
    with golden's force codes."""
    from amaranth.hdl import Shape
    from amaranth.lib import data, enum
    from elmoe3d.golden import esd as gesd

    v = hv.vocab(preset("tiny"))
    assert issubclass(hv.HostOp, enum.IntEnum) and Shape.cast(hv.HostOp).width == 3
    for t in (v.HostCommand, v.HostResponse):
        assert data.Layout.cast(t)["op"].shape is hv.HostOp
    assert all(hv.TileOp[op.name] == op for op in hv.HostOp)
    assert {c.name: int(c) for c in hv.ForceCode} == {c.name: int(c) for c in gesd.ForceCode}
    assert data.Layout.cast(hv.RoundValue).size == hv.VALUE_BITS
    for force, cache, code in [(None, True, hv.ForceCode.AUTO), (gesd.Mode.AR, True, hv.ForceCode.AR),
                               (gesd.Mode.SD, True, hv.ForceCode.SD),
                               (gesd.Mode.AR, False, hv.ForceCode.AR_NO_HB_CACHE)]:
        raw = 9 | gesd.force_code(force, cache) << 8
        fields = data.Const(data.Layout.cast(hv.RoundValue), raw)
        assert (fields.batch, fields.force, fields.zero) == (9, code, 0)
