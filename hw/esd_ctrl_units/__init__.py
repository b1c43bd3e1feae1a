"""The Elastic-SD controller's units (block ``esd_ctrl``): small components
joined by streams, composed in :mod:`elmoe3d.hw.esd_ctrl`.

================  ======================================================================
module            component
================  ======================================================================
``host``          :class:`~.host.HostFrontEnd` (host commands to units, responses back)
``round``         :class:`~.round.Round` (ROUND, STEP admission, DECAY, ACCEPT, draft length)
``step``          :class:`~.step.LayerStep` (eligibility probe, ``StepInfo``, passes)
``pass_engine``   :class:`~.pass_engine.PassEngine` (per-expert lookups, fills, sources)
``pass_end``      :class:`~.pass_end.PassEnd` (a pass's ledger and retirement)
``kv``            :class:`~.kv.KvBoundary` (CONTEXT: KV boundary moves)
``prefetch``      :class:`~.prefetch.Prefetcher` (prefetch during drafts; only with a
                  prefetch depth)
``counters``      :class:`~.counters.Counters` (statistics counters, COUNTER readout)
``trace``         :class:`~.trace.TraceEmitter` (every unit's events into ``trace``)
``tag_client``    :class:`~.tag_client.TagClient` (the units' tag-unit round trips)
``payloads``      the types between them; ``common``: the registered output
================  ======================================================================

Each unit is a block of its own (``esd_<module>``, top
``elmoe3d_esd_<module>``), so ``elmoe3d synth --blocks esd_round`` measures
it alone.
"""

from ...config import Config

__all__ = ["BLOCK_SPECS", "UNITS"]


def _units():
    from .counters import Counters
    from .host import HostFrontEnd
    from .kv import KvBoundary
    from .pass_end import PassEnd
    from .pass_engine import PassEngine
    from .prefetch import Prefetcher
    from .round import Round
    from .step import LayerStep
    from .tag_client import TagClient
    from .trace import TraceEmitter
    return {
        "host": (HostFrontEnd, "host front end: host commands to the units, responses"),
        "round": (Round, "round: mode decision, step admission, DECAY, ACCEPT, draft length"),
        "step": (LayerStep, "layer step: DRAFT eligibility probe, StepInfo, passes"),
        "pass_engine": (PassEngine, "pass engine: lookups, allocations, touches, LPDDR reads, "
                                    "sources"),
        "pass_end": (PassEnd, "pass end: the pass's ledger, fill ends, unpins, aborts"),
        "kv": (KvBoundary, "KV boundary: CONTEXT, KV moves, invalidations"),
        "prefetch": (lambda cfg: Prefetcher(cfg, 2), "prefetcher: prefetch candidates' "
                                                      "lookups, allocations, fill-only reads, "
                                                      "their retirement (depth 2)"),
        "counters": (Counters, "statistics counters and the COUNTER readout"),
        "trace": (lambda cfg: TraceEmitter(cfg, 5), "trace emitter: five producers into "
                                                      "the trace stream"),
        "tag_client": (lambda cfg: TagClient(cfg, 4), "tag client: four users, one command "
                                                       "in flight"),
    }


#: unit name -> (factory of a Config, description)
UNITS = _units()


def _register():
    from ...blocks import Block
    out = []
    for i, (name, (make, what)) in enumerate(UNITS.items()):
        out.append(Block(f"esd_{name}", f"elmoe3d_esd_{name}", f"Elastic-SD controller unit, {what}",
                         params=lambda cfg: cfg.to_dict(),
                         factory=lambda make=make, **fields: make(Config(**fields)),
                         order=71 + i / 100, synth=False, part_of="esd_ctrl"))
    return out


BLOCK_SPECS = _register()
