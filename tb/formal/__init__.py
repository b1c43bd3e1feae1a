"""Formal (SymbiYosys) wrappers of the blocks: each ``<block>.py`` wraps one
block with its properties as Amaranth ``Assert``/``Assume``/``Cover``
statements, for :func:`elmoe3d.sim.run.formal.run_sby`. Test scaffolding only:
nothing here is synthesised (``hw/`` holds what users build)."""
