"""The token-batched MoE layer datapath (block ``moe_layer``): small
components joined by streams and by the named side-channel signatures of
:mod:`.ports`, composed in :mod:`.datapath`.

==================  ==========================================================
module              component
==================  ==========================================================
``tokens``          :class:`~.tokens.TokenStore` (passes of up to ``T`` tokens)
``hb_reader``       :class:`~.hb_reader.HBReader`, :class:`~.hb_reader.RecordPath`
``ext_port``        :class:`~.ext_port.ExtWriter` (LPDDR beats, checked)
``buffers``         :class:`~.buffers.ReplayBuffer` (HB and LPDDR weight buffers)
``scheduler``       :class:`~.scheduler.ExpertScheduler` (announce, decide, job table)
``issue``           :class:`~.issue.Issue` (segments x tokens -> PE beats)
``pe_array``        :class:`~.pe_array.PEArray` (``B`` bit-slice PEs)
``vector_unit``     :class:`~.vector_unit.VectorUnit` (requantise, SiLU, combine)
``topk``            :class:`~.topk.TopK` (streaming top-k)
``softmax``         :class:`~.softmax.Softmax` (Q12 gates)
``output``          :class:`~.output.OutputStage` (outputs, counters)
``ports``           the side channels' signatures (:class:`~.ports.PassView`, ...)
``queue``           :class:`~.queue.Queue` (a FIFO with a shape and streams)
==================  ==========================================================
"""

from .datapath import MoEDatapath

__all__ = ["MoEDatapath", "BLOCK_SPECS"]


def _params(cfg):
    return {"config": cfg.to_dict()}


def _factory(config):
    from ...config import Config
    return MoEDatapath(Config(**config))


def _register():
    from ...blocks import Block
    return [Block("moe_layer", "elmoe3d_moe_layer",
                  "token-batched MoE layer: router, top-k, SwiGLU experts on token-parallel "
                  "bit-slice PEs, split or whole-resident verify",
                  _params, _factory, order=60,
                  timing="each needed expert once per pass of up to T tokens; 1 slice vector "
                         "per PE per cycle for P tokens",
                  sweep=(dict(batch_tokens=16), dict(batch_tokens=80)))]


BLOCK_SPECS = _register()
