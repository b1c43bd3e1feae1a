"""Lint gate (issue 10, item 11): Verilator ``--lint-only -Wall`` on the
Verilog of every registered block, with the waivers committed in
``constraints/lint_waivers.vlt``; any warning that is not waived fails."""

import pytest

from elmoe3d.blocks import blocks
from elmoe3d.config import preset
from elmoe3d.sim.run.harness import write_verilog
from elmoe3d.sim.flow.lint import lint, waiver_file

pytestmark = pytest.mark.lint


@pytest.mark.parametrize("name", list(blocks()))
def test_block_lint_clean(name, tmp_path):
    b = blocks()[name]
    v = write_verilog(b.build(preset("default")), b.top, tmp_path / f"{b.top}.v")
    warnings = lint(v, b.top)
    assert not warnings, f"{len(warnings)} new lint warning(s) in {name}:\n" + "\n".join(
        str(w) for w in warnings[:20])


def test_gate_catches_a_new_warning(tmp_path):
    """A planted defect (an output never driven) is reported: the gate can fail."""
    v = tmp_path / "bad.v"
    v.write_text("module bad(input wire clk, input wire a, output wire y, output wire z);\n"
                 "  assign y = a;\nendmodule\n")
    rules = {w.rule for w in lint(v, "bad")}
    assert "UNDRIVEN" in rules


def test_waivers_are_explained():
    """Every waiver line is preceded by a comment saying why it exists."""
    lines = waiver_file().read_text().splitlines()
    assert lines[0] == "`verilator_config"
    for i, line in enumerate(lines):
        if line.startswith("lint_off"):
            j = i - 1
            while j > 0 and lines[j].startswith("lint_off"):
                j -= 1
            assert lines[j].startswith("//"), f"waiver without a reason: {line}"


def test_syntax_error_is_not_clean(tmp_path):
    v = tmp_path / "broken.v"
    v.write_text("module broken(input wire a; endmodule\n")
    with pytest.raises(RuntimeError, match="lint-only failed"):
        lint(v, "broken")
