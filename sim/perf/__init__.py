"""System-level performance and energy model, installed as ``elmoe3d.sim.perf``.

Modules: :mod:`.models` (model shapes), :mod:`.hardware` (chip configs and
RTL-measured figures), :mod:`.traces` (routing-trace format, loader,
generator, locality statistics), :mod:`.fastpolicy` (the tag-unit policy in
NumPy, tested op for op against the golden), :mod:`._kernels` (compiled
inner loops), :mod:`.cache` (the tag-unit cache driver, LRU/LFU/static/Belady),
:mod:`.acceptance` (draft acceptance fitted to the LM's measurements),
:mod:`.tile_model` (the tile's cycle model: the golden controller's passes
priced by the datapath's pass bound and fitted fixed costs),
:mod:`.validate` (its fit and validation against every recorded RTL run),
:mod:`.claims` (the paper's claims recomputed on it); the older roofline
grid: :mod:`.systems` (the systems compared), :mod:`.grid` (grid, ratios,
bounds, ablations, side by side with the paper), :mod:`.rtl_compare` (model
vs RTL tile counters), :mod:`.plots`. Data files in ``data/``. See
``docs/blocks/perf.md``.
"""

from .models import ModelShape, get_model, model_names
from .hardware import Hardware, get_hardware, rtl_figures
from .traces import Trace, generate, load_trace, save_trace
from .acceptance import AcceptanceModel
from .fastpolicy import FastTagUnit
from .systems import SYSTEMS, PRIOR, Workload, run_system
from .grid import run_grid, ablations, side_by_side

__all__ = ["ModelShape", "get_model", "model_names", "Hardware", "get_hardware", "rtl_figures",
           "Trace", "generate", "load_trace", "save_trace", "AcceptanceModel", "FastTagUnit",
           "SYSTEMS", "PRIOR", "Workload", "run_system", "run_grid", "ablations", "side_by_side"]
