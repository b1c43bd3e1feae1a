"""Simulation drivers (cocotb harness, synthesis flow, studies), installed as
``elmoe3d.sim``."""
