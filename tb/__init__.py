"""cocotb testbenches, installed as ``elmoe3d.tb``; run them through
``elmoe3d.sim.harness`` (pytest entry points live in ``tests/``)."""
