"""Simulation drivers (cocotb harness, synthesis flow, studies), installed as
``elmoe3d.sim``."""

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
