"""cocotb testbenches, installed as ``elmoe3d.tb``; run them through
``elmoe3d.sim.run.harness`` (pytest entry points live in ``tests/``)."""
