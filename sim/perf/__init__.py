"""System-level performance and energy model, installed as ``elmoe3d.sim.perf``.

One cycle model: :mod:`.tile_model` prices the passes the golden controller
decides with the datapath's own pass bound and fitted fixed costs;
:mod:`.validate` fits it and checks it against every recorded RTL run;
:mod:`.claims` recomputes the paper's claims on it at the ``paper`` preset.
What they read: :mod:`.models` (the published MoE shapes and their routing
locality), :mod:`.hardware` (the paper's chips: capacity, bandwidth,
energy), :mod:`.traces` (routing-trace format, loader, generator, locality
statistics), :mod:`.acceptance` (draft acceptance fitted to the LM's
measurements). :mod:`.rtl_compare` replays the tile's recorded routing
through the tag-unit cache driver (:mod:`.cache`, :mod:`.fastpolicy`,
:mod:`._kernels`) and compares the cache counters with the tile's. Data
files in ``data/``. See ``docs/blocks/perf.md``.
"""

from .models import ModelShape, get_model, model_names
from .hardware import Hardware, get_hardware
from .traces import Trace, generate, load_trace, save_trace
from .acceptance import AcceptanceModel
from .fastpolicy import FastTagUnit

__all__ = ["ModelShape", "get_model", "model_names", "Hardware", "get_hardware",
           "Trace", "generate", "load_trace", "save_trace", "AcceptanceModel", "FastTagUnit"]
