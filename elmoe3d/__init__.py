"""ELMoE-3D reference RTL: Amaranth blocks (``elmoe3d.hw``), NumPy golden models
(``elmoe3d.golden``), cocotb testbenches (``elmoe3d.tb``) and simulation / model
drivers (``elmoe3d.sim``)."""

from .config import PRESETS, Config, preset

__all__ = ["Config", "PRESETS", "preset", "__version__"]

__version__ = "0.1.0"
