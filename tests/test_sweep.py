"""Design-space sweeps on Dask: a 4-point sweep on a 2-worker LocalCluster."""

import json

import pytest

from elmoe3d.cli import main
from elmoe3d.sim.flow.sweep import parse_sets, pareto, points

pytestmark = [pytest.mark.sweep, pytest.mark.synth]


def test_parse_and_points():
    sets = parse_sets(["lanes=4,8", "slice_bits=2,4"])
    assert sets == {"lanes": [4, 8], "slice_bits": [2, 4]}
    pts = points(["pe", "tag_unit"], sets)
    assert len(pts) == 8 and pts[0] == {"block": "pe", "overrides": {"lanes": 4, "slice_bits": 2}}
    for bad, msg in ((["lanes"], "KEY=V1"), (["nope=1"], "unknown Config field"),
                     (["lanes=a"], "expected integers")):
        with pytest.raises(ValueError, match=msg):
            parse_sets(bad)


def test_pareto_front():
    rs = [{"cells": 10, "y": 1}, {"cells": 20, "y": 3}, {"cells": 30, "y": 2}, {"cells": 5, "y": 1}]
    assert [r["cells"] for r in pareto(rs, "cells", "y")] == [5, 20]


def test_four_point_sweep_on_local_cluster(tmp_path, capsys):
    work = tmp_path / "sw"
    argv = ["sweep", "--set", "lanes=4,8", "--set", "max_len=128,256", "--blocks", "pe",
            "--preset", "tiny", "--workers", "2", "--workdir", str(work), "--no-progress"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    res = json.loads((work / "sweep.json").read_text())["points"]
    assert len(res) == 4 and all("error" not in r for r in res)
    by = {(r["overrides"]["lanes"], r["overrides"]["max_len"]): r for r in res}
    assert by[(8, 256)]["cells"] > by[(4, 256)]["cells"]      # area grows with lanes
    assert (work / "sweep.csv").read_text().count("\n") == 5
    assert (work / "pareto.png").stat().st_size > 1000
    assert "lanes=8,max_len=256" in out
    # a second sweep reuses every point's cached synthesis (the Verilog did not change)
    stamp = (work / "pe-lanes8-max_len256" / "generic.json").stat().st_mtime_ns
    assert main(argv) == 0
    assert (work / "pe-lanes8-max_len256" / "generic.json").stat().st_mtime_ns == stamp


def test_refused_configuration_is_a_result(tmp_path):
    from elmoe3d.sim.flow.sweep import run_point
    r = run_point({"block": "pe", "overrides": {"slice_bits": 3}}, "tiny", str(tmp_path), False, None)
    assert "Slice width" in r["error"]
