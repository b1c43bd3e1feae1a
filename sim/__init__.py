"""Simulation drivers, installed as ``elmoe3d.sim``, by concern:

``run``
    the cocotb harness and formal runner, the native (Verilator C++) tile
    harness and its scripts, the MoE pass benchmark, the report runs;
``flow``
    synthesis, place and route, FPGA boards and IP (records, catalogue,
    timing, interface sheets, FuseSoC cores, lint, sweeps, peers);
``perf``
    the system model (tile cycle model, claims, validation);
``lm``
    the in-project MoE LM and its studies (evidence, quantisation).

Recorded data (``data/``) and the native harness's C++ (``native/``) stay
here."""

import os as _os
import sys as _sys


def run_cli(main) -> None:
    """Run a module's ``main()`` as ``python -m``: exit with its return code;
    a reader that stops early (``| head``) is not an error."""
    try:
        _sys.exit(main())
    except BrokenPipeError:
        _os.dup2(_os.open(_os.devnull, _os.O_WRONLY), _sys.stdout.fileno())
        _sys.exit(0)
