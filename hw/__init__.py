"""Amaranth HDL components of ELMoE-3D, installed as ``elmoe3d.hw``."""
