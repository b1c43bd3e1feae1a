"""System-level performance and energy model (issue 6), installed as ``elmoe3d.sim.perf``.

Modules: :mod:`.models` (model shapes), :mod:`.hardware` (chip configs and
RTL-measured figures), :mod:`.traces` (routing-trace format, loader and
generator), :mod:`.cache` (LRU, the golden tag unit as the ELMoE-3D cache,
Belady), :mod:`.acceptance` (draft acceptance model / measured file),
:mod:`.systems` (the systems compared), :mod:`.grid` (grid, ratios,
ablations, side by side with the paper), :mod:`.plots`. Data files in
``data/``. See ``docs/blocks/perf.md``.
"""

from .models import ModelShape, get_model, model_names
from .hardware import Hardware, get_hardware, rtl_figures
from .traces import Trace, generate, load_trace, save_trace
from .acceptance import AcceptanceModel
from .systems import SYSTEMS, PRIOR, Workload, run_system
from .grid import run_grid, ablations, side_by_side

__all__ = ["ModelShape", "get_model", "model_names", "Hardware", "get_hardware", "rtl_figures",
           "Trace", "generate", "load_trace", "save_trace", "AcceptanceModel", "SYSTEMS", "PRIOR",
           "Workload", "run_system", "run_grid", "ablations", "side_by_side"]
