"""Small MoE language model: training script and Elastic-SD evidence (issue 7), installed as ``elmoe3d.sim.lm``."""
