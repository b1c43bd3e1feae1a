"""Expert-cache tag unit: ``{layer, expert}`` -> slot directory of the HB
expert cache, with per-slot resident planes, a saturating hotness counter
(decayed by a shift) and a pin count.

The policy is :mod:`elmoe3d.golden.tag_unit`; this component equals it event
for event (every response field, every command). The opcode and error
encodings, the response fields and the error rules are documented there.

How the lookup stays one per cycle
----------------------------------
Every command executes in a single compute stage (``x_``) against the slot
registers, and the slot registers are written at the same clock edge that
moves the command's response into the output register. The next command in
``x_`` therefore always sees the state its predecessors left: there are no
read-after-write hazards to forward and no stalls, whatever mix of
operations arrives. The slot index of a hit is the OR of the indices of the
matching slots (not a priority encoder): at most one valid slot holds a given
tag, which the formal proof (:mod:`elmoe3d.hw.tag_unit_formal`) checks.

Victim choice as one argmin
---------------------------
ALLOCATE wants the lowest-index free slot, else the coldest unpinned slot
(ties to the lowest index). Both are the same search: a balanced argmin tree
over the candidates ``pins == 0`` with key ``{valid, hot}`` (a free slot's
key is forced to 0), where a tie keeps the left (lower-index) operand. A free
slot's key is below every valid slot's key, so the tree returns the lowest
free slot when there is one. A pinned slot is never a candidate; a free slot
is never pinned (PIN of a free slot is refused), so "no candidate" means
"every slot is valid and pinned". The tree carries each slot's tag along so
the evicted tag needs no second multiplexer. Its depth grows as
``log2(S)`` comparator levels, the unit's critical path.
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

from ..golden import tag_unit as gtu

__all__ = ["TagOpcode", "TagErrorCode", "TagUnit", "tag_command_layout",
           "tag_response_layout"]


class TagOpcode(enum.Enum, shape=gtu.OP_BITS):
    """Tag-unit opcode; values equal :class:`elmoe3d.golden.tag_unit.TagOp`."""
    LOOKUP = int(gtu.TagOp.LOOKUP)
    TOUCH = int(gtu.TagOp.TOUCH)
    DECAY = int(gtu.TagOp.DECAY)
    ALLOCATE = int(gtu.TagOp.ALLOCATE)
    INVALIDATE = int(gtu.TagOp.INVALIDATE)
    PIN = int(gtu.TagOp.PIN)
    UNPIN = int(gtu.TagOp.UNPIN)
    RESET = int(gtu.TagOp.RESET)
    STATS = int(gtu.TagOp.STATS)


class TagErrorCode(enum.Enum, shape=gtu.ERROR_BITS):
    """Response error code; values equal :class:`elmoe3d.golden.tag_unit.TagError`."""
    OK = int(gtu.TagError.OK)
    BAD_OP = int(gtu.TagError.BAD_OP)
    BAD_SLOT = int(gtu.TagError.BAD_SLOT)
    RESIDENT = int(gtu.TagError.RESIDENT)
    NO_VICTIM = int(gtu.TagError.NO_VICTIM)
    NOT_VALID = int(gtu.TagError.NOT_VALID)
    NOT_PINNED = int(gtu.TagError.NOT_PINNED)
    PIN_LIMIT = int(gtu.TagError.PIN_LIMIT)
    PINNED = int(gtu.TagError.PINNED)


def value_bits(hot_bits: int, stat_bits: int, pin_bits: int) -> int:
    """Width of the response ``value`` field (hotness, pin count or counter)."""
    return max(hot_bits, stat_bits, pin_bits)


def tag_command_layout(slots: int, tag_bits: int, hot_bits: int,
                       plane_bits: int) -> data.StructLayout:
    """``TagCommand``: opcode, tag, slot (PIN/UNPIN; counter index for STATS),
    amount (TOUCH increment, ALLOCATE initial hotness), planes (ALLOCATE)."""
    return data.StructLayout({
        "op": TagOpcode,
        "tag": unsigned(tag_bits),
        "slot": unsigned(gtu.slot_bits(slots)),
        "amount": unsigned(hot_bits),
        "planes": unsigned(plane_bits),
    })


def tag_response_layout(slots: int, tag_bits: int, plane_bits: int,
                        vbits: int) -> data.StructLayout:
    """``TagResponse``: see :data:`elmoe3d.golden.tag_unit.RESPONSE_FIELDS`."""
    return data.StructLayout({
        "op": TagOpcode,
        "error": TagErrorCode,
        "hit": unsigned(1),
        "slot": unsigned(gtu.slot_bits(slots)),
        "planes": unsigned(plane_bits),
        "evicted": unsigned(1),
        "evicted_tag": unsigned(tag_bits),
        "value": unsigned(vbits),
    })


class TagUnit(wiring.Component):
    """Expert-cache tag unit with ``S`` fully associative slots.

    Parameters
    ----------
    slots : int
        ``S``, slots (2..4096 as in :class:`~elmoe3d.config.Config`; 8..128
        tested). Default 32.
    layer_bits, expert_bits : int
        Tag ``{layer, expert}`` width (1..16 each). Default 6 + 7.
    hot_bits : int
        Hotness counter width (saturating), also the ``amount`` width. Default 8.
    decay_shift : int
        ``d`` in DECAY's ``hot -= hot >> d`` (0..hot_bits). Default 2.
    plane_bits : int
        Resident-planes field width (1..8). Default 2.
    stat_bits : int
        Saturating statistics counter width (1..64). Default 32.
    pin_bits : int
        Pin counter width per slot (1..16). Default 3.

    Members
    -------
    i : ``In(stream.Signature(tag_command_layout(...)))``
        Commands (``TagCommand``).
    o : ``Out(stream.Signature(tag_response_layout(...)))``
        Exactly one response (``TagResponse``) per command, in order.
    state_valid, state_tag, state_planes, state_hot, state_pins : list of Signal
        The slot registers, exposed for the formal wrapper only (testbenches
        use the ports).

    Latency and throughput: every operation (LOOKUP, TOUCH, DECAY, ALLOCATE,
    INVALIDATE, PIN, UNPIN, RESET, STATS) is accepted one per cycle, back to
    back, and its response is valid **2 cycles** after the command transfer
    (one input register, one output register). ``i.ready`` is
    ``~o.valid | o.ready`` (global stall), so with an always-ready consumer
    the unit sustains one lookup per cycle with no bubbles.

    Raises
    ------
    TypeError, ValueError
        For a parameter of the wrong kind or value, naming it.
    """

    def __init__(self, *, slots: int = 32, layer_bits: int = 6, expert_bits: int = 7,
                 hot_bits: int = 8, decay_shift: int = 2, plane_bits: int = 2,
                 stat_bits: int = 32, pin_bits: int = 3):
        gtu.check_params(slots, layer_bits, expert_bits, hot_bits, decay_shift, plane_bits,
                         stat_bits, pin_bits)
        self.slots = slots
        self.layer_bits = layer_bits
        self.expert_bits = expert_bits
        self.tag_bits = layer_bits + expert_bits
        self.hot_bits = hot_bits
        self.decay_shift = decay_shift
        self.plane_bits = plane_bits
        self.stat_bits = stat_bits
        self.pin_bits = pin_bits
        self.slot_bits = gtu.slot_bits(slots)
        self.value_bits = value_bits(hot_bits, stat_bits, pin_bits)
        self.cmd_layout = tag_command_layout(slots, self.tag_bits, hot_bits, plane_bits)
        self.rsp_layout = tag_response_layout(slots, self.tag_bits, plane_bits, self.value_bits)
        super().__init__({
            "i": In(stream.Signature(self.cmd_layout)),
            "o": Out(stream.Signature(self.rsp_layout)),
        })
        S = slots
        self.state_valid = [Signal(name=f"valid{s}") for s in range(S)]
        self.state_tag = [Signal(self.tag_bits, name=f"tag{s}") for s in range(S)]
        self.state_planes = [Signal(plane_bits, name=f"planes{s}") for s in range(S)]
        self.state_hot = [Signal(hot_bits, name=f"hot{s}") for s in range(S)]
        self.state_pins = [Signal(pin_bits, name=f"pins{s}") for s in range(S)]
        # compute-stage command and its derived decisions (formal wrapper only)
        self.x_valid = Signal()
        self.x_cmd = Signal(self.cmd_layout)
        self.x_fire = Signal()               # the x_ command executes this cycle
        self.x_victim = Signal(range(S))
        self.x_error = Signal(TagErrorCode)
        self.counters = [Signal(stat_bits, name=f"stat_{n}") for n in gtu.STAT_NAMES]

    #: Formal-harness self-check only (:mod:`elmoe3d.hw.tag_unit_formal`): set
    #: on an instance to ``"victim_ignores_pins"`` or ``"hot_wraps"`` to plant a
    #: bug that the proof must catch. Never set otherwise.
    _formal_bug = None

    def params(self) -> dict:
        return dict(slots=self.slots, layer_bits=self.layer_bits, expert_bits=self.expert_bits,
                    hot_bits=self.hot_bits, decay_shift=self.decay_shift,
                    plane_bits=self.plane_bits, stat_bits=self.stat_bits, pin_bits=self.pin_bits)

    def elaborate(self, platform):
        m = Module()
        S = self.slots
        hmax = (1 << self.hot_bits) - 1
        valid, tags, planes = self.state_valid, self.state_tag, self.state_planes
        hot, pins = self.state_hot, self.state_pins

        # ---- pipeline control and input register --------------------------
        adv = Signal()
        m.d.comb += [adv.eq(~self.o.valid | self.o.ready), self.i.ready.eq(adv)]
        x_valid, x = self.x_valid, self.x_cmd
        with m.If(adv):
            m.d.sync += [x_valid.eq(self.i.valid), x.eq(self.i.payload)]
        fire = self.x_fire
        m.d.comb += fire.eq(adv & x_valid)

        # ---- x_: tag match (one-hot by the uniqueness invariant) ---------
        match = Signal(S)
        m.d.comb += match.eq(Cat(valid[s] & (tags[s] == x.tag) for s in range(S)))
        hit = match.any()
        m_slot = Signal(self.slot_bits)
        m_planes = Signal(self.plane_bits)
        m_hot = Signal(self.hot_bits)
        m_pins = Signal(self.pin_bits)

        def or_select(values, width):
            acc = Const(0, width)
            for s, v in enumerate(values):
                acc = acc | Mux(match[s], v, 0)
            return acc
        m.d.comb += [
            m_slot.eq(or_select([Const(s, self.slot_bits) for s in range(S)], self.slot_bits)),
            m_planes.eq(or_select(planes, self.plane_bits)),
            m_hot.eq(or_select(hot, self.hot_bits)),
            m_pins.eq(or_select(pins, self.pin_bits)),
        ]
        hot_sum = Signal(self.hot_bits + 1)
        hot_sat = Signal(self.hot_bits)
        m.d.comb += [hot_sum.eq(m_hot + x.amount),
                     hot_sat.eq(Mux(hot_sum > hmax, hmax, hot_sum))]
        if self._formal_bug == "hot_wraps":
            m.d.comb += hot_sat.eq(hot_sum[:self.hot_bits])

        # ---- x_: victim = argmin over unpinned slots of {valid, hot} ------
        # Each tree node: (candidate, key, index, tag); a tie keeps the left.
        nodes = []
        for s in range(S):
            key = Signal(self.hot_bits + 1, name=f"vkey{s}")
            m.d.comb += key.eq(Mux(valid[s], Cat(hot[s], Const(1, 1)), 0))
            cand = (pins[s] == 0) if self._formal_bug != "victim_ignores_pins" else Const(1)
            nodes.append((cand, key, Const(s, range(S)), tags[s]))
        level = 0
        while len(nodes) > 1:
            nxt = []
            for j in range(0, len(nodes) - 1, 2):
                (lc, lk, li, lt), (rc, rk, ri, rt) = nodes[j], nodes[j + 1]
                take_r = Signal(name=f"vtake_{level}_{j // 2}")
                m.d.comb += take_r.eq(rc & (~lc | (rk < lk)))
                c = Signal(name=f"vc_{level}_{j // 2}")
                k = Signal(self.hot_bits + 1, name=f"vk_{level}_{j // 2}")
                i = Signal(range(S), name=f"vi_{level}_{j // 2}")
                t = Signal(self.tag_bits, name=f"vt_{level}_{j // 2}")
                m.d.comb += [c.eq(lc | rc), k.eq(Mux(take_r, rk, lk)),
                             i.eq(Mux(take_r, ri, li)), t.eq(Mux(take_r, rt, lt))]
                nxt.append((c, k, i, t))
            if len(nodes) % 2:
                nxt.append(nodes[-1])
            nodes, level = nxt, level + 1
        v_any, v_key, v_idx, v_tag = nodes[0]
        v_evict = v_key[self.hot_bits]       # the victim holds a valid tag
        m.d.comb += self.x_victim.eq(v_idx)

        # ---- x_: slot-addressed reads for PIN / UNPIN ----------------------
        slot_ok = x.slot < S
        a_valid = Array(valid)[x.slot] & slot_ok
        a_pins = Array(pins)[x.slot]
        pin_max = (1 << self.pin_bits) - 1

        # ---- x_: decide error and response --------------------------------
        err = self.x_error
        rsp = Signal(self.rsp_layout)
        m.d.comb += [rsp.op.eq(x.op), rsp.error.eq(err)]
        stat_sel = Signal(self.stat_bits)
        m.d.comb += stat_sel.eq(Array(self.counters)[x.slot[:2]])
        with m.Switch(x.op):
            with m.Case(TagOpcode.LOOKUP, TagOpcode.TOUCH):
                m.d.comb += [rsp.hit.eq(hit), rsp.slot.eq(m_slot), rsp.planes.eq(m_planes),
                             rsp.value.eq(Mux(~hit, 0, Mux(x.op == TagOpcode.TOUCH, hot_sat, m_hot)))]
            with m.Case(TagOpcode.DECAY, TagOpcode.RESET):
                pass
            with m.Case(TagOpcode.ALLOCATE):
                with m.If(hit):
                    m.d.comb += err.eq(TagErrorCode.RESIDENT)
                with m.Elif(~v_any):
                    m.d.comb += err.eq(TagErrorCode.NO_VICTIM)
                m.d.comb += [rsp.slot.eq(v_idx), rsp.evicted.eq(v_evict),
                             rsp.evicted_tag.eq(Mux(v_evict, v_tag, 0))]
            with m.Case(TagOpcode.INVALIDATE):
                with m.If(hit & (m_pins != 0)):
                    m.d.comb += err.eq(TagErrorCode.PINNED)
                m.d.comb += [rsp.hit.eq(hit), rsp.slot.eq(m_slot), rsp.planes.eq(m_planes)]
            with m.Case(TagOpcode.PIN, TagOpcode.UNPIN):
                is_pin = x.op == TagOpcode.PIN
                with m.If(~slot_ok):
                    m.d.comb += err.eq(TagErrorCode.BAD_SLOT)
                with m.Elif(~a_valid):
                    m.d.comb += err.eq(TagErrorCode.NOT_VALID)
                with m.Elif(is_pin & (a_pins == pin_max)):
                    m.d.comb += err.eq(TagErrorCode.PIN_LIMIT)
                with m.Elif(~is_pin & (a_pins == 0)):
                    m.d.comb += err.eq(TagErrorCode.NOT_PINNED)
                m.d.comb += [rsp.slot.eq(x.slot),
                             rsp.value.eq(Mux(is_pin, a_pins + 1, a_pins - 1)[:self.pin_bits])]
            with m.Case(TagOpcode.STATS):
                with m.If(x.slot >= len(gtu.STAT_NAMES)):
                    m.d.comb += err.eq(TagErrorCode.BAD_SLOT)
                m.d.comb += [rsp.slot.eq(x.slot), rsp.value.eq(stat_sel)]
            with m.Default():
                m.d.comb += err.eq(TagErrorCode.BAD_OP)

        ok = Signal()
        m.d.comb += ok.eq(fire & (err == TagErrorCode.OK))
        with m.If(adv):
            m.d.sync += self.o.valid.eq(x_valid)
            with m.If(err == TagErrorCode.OK):
                m.d.sync += self.o.payload.eq(rsp)
            with m.Else():
                m.d.sync += [self.o.payload.eq(0), self.o.payload.op.eq(x.op),
                             self.o.payload.error.eq(err)]

        # ---- state update (same edge as the response) ---------------------
        def count(idx, cond):
            c = self.counters[idx]
            with m.If(cond & (c != (1 << self.stat_bits) - 1)):
                m.d.sync += c.eq(c + 1)

        with m.If(ok):
            with m.Switch(x.op):
                with m.Case(TagOpcode.LOOKUP):
                    count(0, 1)
                    count(1, hit)
                with m.Case(TagOpcode.TOUCH):
                    for s in range(S):
                        with m.If(match[s]):
                            m.d.sync += hot[s].eq(hot_sat)
                with m.Case(TagOpcode.DECAY):
                    for s in range(S):
                        m.d.sync += hot[s].eq(hot[s] - (hot[s] >> self.decay_shift))
                with m.Case(TagOpcode.ALLOCATE):
                    count(2, 1)
                    count(3, v_evict)
                    for s in range(S):
                        with m.If(v_idx == s):
                            m.d.sync += [valid[s].eq(1), tags[s].eq(x.tag),
                                         planes[s].eq(x.planes), hot[s].eq(x.amount),
                                         pins[s].eq(0)]
                with m.Case(TagOpcode.INVALIDATE):
                    for s in range(S):
                        with m.If(match[s]):
                            m.d.sync += [valid[s].eq(0), tags[s].eq(0), planes[s].eq(0),
                                         hot[s].eq(0), pins[s].eq(0)]
                with m.Case(TagOpcode.PIN, TagOpcode.UNPIN):
                    for s in range(S):
                        with m.If(x.slot == s):
                            m.d.sync += pins[s].eq(rsp.value)
                with m.Case(TagOpcode.RESET):
                    for s in range(S):
                        m.d.sync += [valid[s].eq(0), tags[s].eq(0), planes[s].eq(0),
                                     hot[s].eq(0), pins[s].eq(0)]
                    m.d.sync += [c.eq(0) for c in self.counters]
        return m


def _tag_params(cfg) -> dict:
    return dict(slots=cfg.tag_slots, layer_bits=cfg.layer_bits, expert_bits=cfg.expert_bits,
                hot_bits=8, decay_shift=2, plane_bits=max(1, cfg.planes.bit_length()),
                stat_bits=32, pin_bits=3)


def _register():
    from ..blocks import Block
    return [
        Block("tag_unit", "elmoe3d_tag_unit",
              "expert-cache tag unit: {layer, expert} -> slot, hotness, pins, 1 lookup/cycle",
              _tag_params, TagUnit, order=30,
              sweep=(dict(tag_slots=8), dict(tag_slots=32, hb_words=16384),
                     dict(tag_slots=128, hb_words=65536))),
    ]


BLOCK_SPECS = _register()
