"""System-level performance and energy model (issue 6), installed as ``elmoe3d.sim.perf``."""
