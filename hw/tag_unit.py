"""Expert-cache tag unit: the ``{layer, expert}`` -> slot directory of the HB
expert cache, with per-slot state (FREE / PENDING / RESIDENT), resident
planes, a saturating hotness counter (decayed by a shift) and a pin count.

The policy - *what* every command does and chooses - is
:mod:`elmoe3d.golden.tag_unit`; this component equals it event for event
(every response field, every command, the ``resident`` / ``pending`` masks
every cycle). This docstring states *when*.

Ports
-----
``i`` (``TagCommand`` stream) in, ``o`` (``TagResponse`` stream) out: one
response per command, in order. ``commit`` (``SlotStrobe``: ``valid``,
``slot``) is HB's commit strobe, taken in the cycle it is valid (no
back-pressure). ``disabled`` (S bits) is HB's registered KV-covered slot mask.
``resident`` / ``pending`` (S bits) are the slot states for the controller
and the joined testbench: slot ``s`` is resident in cycle ``t`` exactly when
HB's ``slot_valid[s]`` is 1 in cycle ``t``.

One cycle, in order
-------------------
A command *executes* in one cycle ``t`` (its response is completed in the
response stage in ``t + 1`` and enters the output queue at the edge ending
``t + 1``: first valid on ``o`` in ``t + 2`` =
``t +`` :attr:`TagUnit.RESPONSE_DELAY`, later only if it queues behind a
stalled response). It sees the slot registers as they are at the start of ``t``; at the edge that ends ``t`` take
effect, in the order of :meth:`elmoe3d.golden.tag_unit.TagUnitModel.step`:

1. the command;
2. ``disabled`` of cycle ``t``: every slot it covers that holds a tag is freed;
3. the ``commit`` strobe of cycle ``t``: its slot, if PENDING (after 1 and 2),
   becomes RESIDENT - the same edge at which HB sets its valid bit.

``resident`` and ``pending`` are the slot registers masked by the current
``disabled`` (one gate): a slot the KV region covers drops out in the very
cycle HB's covered mask rises (HB clears its valid bit at that edge), and a
commit shows in the cycle after its strobe, as HB's valid bit does; so they
equal HB's ``slot_valid`` in every cycle. A command in the cycle a slot
becomes covered still sees the slot as the registers hold it (HB refuses any
read or fill of a covered slot with an error, and the controller orders KV
moves against LOOKUP_PIN and ALLOCATE anyway, since the same window exists
one cycle earlier); in exchange no input reaches an execute decision, which
is what lets the unit close timing.

Latency and throughput
----------------------
``i.ready`` is a flip-flop (:class:`~elmoe3d.hw.streams.RegisterSlice` at the
input) and ``o`` is a register: no combinational path from ``o.ready`` to
``i.ready``, and no input reaches an execute decision. A command accepted in
cycle ``a`` reaches the execute stage (``x_``) in ``a + 2``; its response
follows two stages later (the response stage, then ``o``). Three classes:

* **single-cycle** - LOOKUP, TOUCH, DECAY, RESET, STATS and bad opcodes cannot
  fail on slot state; they execute at once: response valid
  :attr:`TagUnit.LATENCY` = **4** cycles after the command transfer, **one
  per cycle, back to back** (each reads the slot registers its predecessor
  wrote at the previous edge; no hazard). STATS waits while a statistics
  increment may be in flight (counters add one cycle after the event;
  commits two; slots freed by ``disabled`` ``1 +``
  :attr:`TagUnit.kv_count_stages`, i.e. two up to 16 slots, three at 32 and
  64, four at 128): 4 cycles on a quiet state, 5 right behind a counted
  command, up to 6 behind a commit strobe and up to ``5 +
  kv_count_stages`` behind a change of ``disabled`` (any change: a slot is
  freed by ``disabled`` only in a cycle in which the mask changes, so STATS
  waits on that superset).
* **two-cycle** - LOOKUP_PIN, INVALIDATE, INVALIDATE_SLOT, PIN, UNPIN, ABORT can
  fail on slot state (pin limit, pinned, not valid, not pending). In their
  first cycle in ``x_`` their per-slot terms are registered (the slot they
  name, whether it makes them fail, whether it is the one they need, their
  per-slot write enables); they execute in a later cycle in which nothing
  changed the state since (their second, unless a commit strobe or a
  ``disabled`` change arrived), with the error from those registers:
  latency **5**, one per two cycles.
* **settling** - ALLOCATE and INVALIDATE_MASK decide from registered
  summaries of the slot state (the victim, "tag already held", "a masked
  slot is pinned"). They execute in the first cycle, from their second cycle
  in ``x_`` on, in which the slot state has been unchanged for
  :attr:`TagUnit.victim_settle` = ``P`` cycles; while they wait nothing
  executes. *State changes* are: any executed command other than LOOKUP and
  STATS, a commit strobe, a change of ``disabled``. Latency **5** cycles when
  the state has been quiet; ``4 + P`` right behind a state-changing command.

With an always-ready consumer the unit sustains **one LOOKUP/TOUCH per
cycle**. Output: a response stage that never holds, then a two-entry output
queue (``o`` and a skid register). A command executes only in a cycle in
which ``o`` is empty or its response is taken, so the response stage always
finds room; back-pressure on ``o`` stalls execution (and so the input) only
while ``o`` holds a response that is not taken. The observable rule (used
by the testbench): a response that appears on an idle ``o`` executed
``RESPONSE_DELAY`` = 2 cycles before; one that follows its predecessor
without a gap executed in the cycle before the predecessor first became
valid.

Victim search as a pipelined argmin
-----------------------------------
ALLOCATE wants the lowest-index FREE enabled slot, else the coldest unpinned
RESIDENT enabled slot (ties to the lowest index). Both are one search: a
balanced argmin tree over the candidates with key ``{holds a tag, hot}`` (a
free slot's key is 0, below every held slot's), a tie keeping the left
(lower-index) operand. The victim depends only on slot state, so the tree
runs every cycle, unconditionally: its leaves are registered and a register
follows every comparator level (:attr:`LEVELS_PER_STAGE`), so the root
reflects the state of ``P = 1 + ceil(log2(S))`` cycles ago (4 at S = 8, 5 at
S = 16, 6 at S = 32, 8 at S = 128). The settle rule above makes that the
*current* state whenever ALLOCATE uses it - the formal proof checks the
chosen victim against a direct search of the current state. Every node
carries, besides its key and index, the index one-hot (over the slots below
it) and the tag of the slot it chose, so the root's registers hold the
victim's index, one-hot and tag: ALLOCATE's ``evicted_tag`` is a register,
not an S-way mux behind the root.

Per-slot updates are local: every slot computes its own saturating
``hot + amount``, ``hot - (hot >> d)`` and pin increment, and its own write
enable as ``fire`` (or ``fire`` of a command that has waited a cycle) AND a
few registers: the registered tag match, its state bits, the one-hot opcode,
the victim's one-hot, and - for the two-cycle ops - the per-slot enables
registered in their first cycle (exact by the steady rule above), so no
OR over the slots and no error decision sits between ``fire`` and a slot
register. Freeing a slot clears only its "holds a tag" bit (its other
fields are unobservable until the next ALLOCATE overwrites them); a commit
strobe sets ``res`` of its slot whatever the slot's state (``res`` of a
slot that holds no tag is unobservable), so the command's free terms stay
off ``res``. Every response field that comes from a slot (hit, pending,
slot, planes, hotness, pin count, evicted tag) leaves the execute stage as
registered one-hot vectors over the slots, already zero on an error, and is
picked in the response stage from the slot registers as the command left
them (a TOUCH's new hotness and a PIN's new pin count are then the
registers themselves: no adder on a response path); the other fields
(opcode, error, ALLOCATE's victim, the STATS counter through a registered
one-hot, INVALIDATE_MASK's mask) are ORs of terms gated by the registered
one-hot opcode. The timing class of the command and the "state quiet for P
cycles" test are flip-flops, and so is ``x_go`` ("valid and not waiting",
loaded with its next-cycle value as two flip-flops, ``x_go_q`` and
``x_kill`` for the terms from this cycle's commit strobe and ``disabled``;
the formal wrapper asserts it equals its definition), so ``fire`` (the
command executes) is one LUT of registers and ``o.valid`` / ``o.ready``.
Statistics counters add their increments one cycle after the event
(effective commit strobes: two), saturating on the carry out. Slots freed by
``disabled`` are a mask of S bits: its popcount (``kv_frees``) is 4-bit
counts in plain logic (one LUT4 per result bit) and then a tree of adders,
registered after every :attr:`TagUnit.KV_ADDER_LEVELS_PER_STAGE` = 2 adder
levels (:attr:`TagUnit.kv_count_stages` stages: 1 up to 16 slots, 2 at 32
and 64, 3 at 128), so its depth does not grow with S; in one stage it was
the critical path at 32 slots (10 logic levels, 106.95 MHz).
"""

from __future__ import annotations

import math

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..geometry import (TAG_STAT_NAMES, check_tag_params, tag_slot_bits, tag_unit_params,
                        tag_value_bits)
from .streams import RegisterSlice
from .vocab import TagErrorCode, TagOpcode, bits, slot_strobe, tag_command, tag_response

__all__ = ["TagOpcode", "TagErrorCode", "TagUnit", "value_bits"]

value_bits = tag_value_bits


class TagUnit(wiring.Component):
    """Expert-cache tag unit with ``S`` fully associative slots.

    Parameters
    ----------
    slots : int
        ``S``, slots (2..4096 as in :class:`~elmoe3d.config.Config`; 8..128
        tested). Default 16 (the ``default`` Config).
    layer_bits, expert_bits : int
        Tag ``{layer, expert}`` width (1..16 each). Default 6 + 7.
    hot_bits : int
        Hotness counter width (saturating), also the ``amount`` width. Default 8.
    decay_shift : int
        ``d`` in DECAY's ``hot -= hot >> d`` (0..hot_bits). Default 2.
    plane_bits : int
        Resident-planes field width (1..8; the field is a count). Default 2.
    stat_bits : int
        Saturating statistics counter width (1..64). Default 32.
    pin_bits : int
        Pin counter width per slot (1..16). Default 3.

    The block registry builds it from a Config
    (:func:`elmoe3d.golden.tag_unit.params_from_config`).

    Members
    -------
    i : ``In(stream.Signature(TagCommand))``
        Commands.
    o : ``Out(stream.Signature(TagResponse))``
        Exactly one response per command, in order.
    commit : ``In(SlotStrobe)``
        HB's commit strobe (``valid``, ``slot``): PENDING -> RESIDENT.
    disabled : ``In(S)``
        KV-covered slots (HB's registered covered mask).
    resident, pending : ``Out(S)``
        Slots RESIDENT / PENDING in this cycle (state registers masked by
        ``disabled``).

    Attributes
    ----------
    LATENCY : int
        4: cycles from a command transfer to its response for every
        single-cycle operation (two-cycle operations: ``LATENCY + 1``).
    RESPONSE_DELAY : int
        2: cycles from a command's execution to its response on a free ``o``.
    victim_settle : int
        ``P``: register stages of the victim search (leaves included),
        ``1 + ceil(log2(S))``.
    kv_count_stages : int
        Register stages of the ``kv_frees`` popcount (1 up to 16 slots, 2 at
        32 and 64, 3 at 128): ``kv_frees`` counts a slot freed by
        ``disabled`` ``1 + kv_count_stages`` cycles after the event, and a
        STATS right behind a change of ``disabled`` takes ``LATENCY + 1 +
        kv_count_stages`` cycles.

    Raises
    ------
    TypeError, ValueError
        For a parameter of the wrong kind or value, naming it.
    """

    LATENCY = 4
    #: cycles from a command's execution to its response on ``o`` (``o`` free)
    RESPONSE_DELAY = 2
    #: comparator levels of the victim argmin tree between two registers
    LEVELS_PER_STAGE = 1
    #: adder levels of the ``kv_frees`` popcount between two registers (after
    #: the leaves' 4-bit counts, which are plain logic)
    KV_ADDER_LEVELS_PER_STAGE = 2

    def __init__(self, *, slots: int = 16, layer_bits: int = 6, expert_bits: int = 7,
                 hot_bits: int = 8, decay_shift: int = 2, plane_bits: int = 2,
                 stat_bits: int = 32, pin_bits: int = 3):
        check_tag_params(slots, layer_bits, expert_bits, hot_bits, decay_shift, plane_bits,
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
        self.slot_bits = tag_slot_bits(slots)
        self.index_bits = bits(slots)
        self.value_bits = tag_value_bits(hot_bits, stat_bits, pin_bits)
        self.cmd_layout = tag_command(slots, self.tag_bits, hot_bits, plane_bits)
        self.rsp_layout = tag_response(slots, self.tag_bits, plane_bits, self.value_bits)
        self.victim_levels = max(1, math.ceil(math.log2(slots)))
        self.victim_settle = 1 + math.ceil(self.victim_levels / self.LEVELS_PER_STAGE)
        self.kv_count_stages = popcount_stages(slots, self.KV_ADDER_LEVELS_PER_STAGE)
        super().__init__({
            "i": In(stream.Signature(self.cmd_layout)),
            "o": Out(stream.Signature(self.rsp_layout)),
            "commit": In(slot_strobe(slots)),
            "disabled": In(slots),
            "resident": Out(slots),
            "pending": Out(slots),
        })
        S = slots
        # the slot registers (exposed for the formal wrapper; testbenches use the ports)
        self.state_valid = [Signal(name=f"held{s}") for s in range(S)]      # holds a tag
        self.state_resident = [Signal(name=f"res{s}") for s in range(S)]    # ... RESIDENT
        self.state_tag = [Signal(self.tag_bits, name=f"tag{s}") for s in range(S)]
        self.state_planes = [Signal(plane_bits, name=f"planes{s}") for s in range(S)]
        self.state_hot = [Signal(hot_bits, name=f"hot{s}") for s in range(S)]
        self.state_pins = [Signal(pin_bits, name=f"pins{s}") for s in range(S)]
        self.counters = [Signal(stat_bits, name=f"stat_{n}") for n in TAG_STAT_NAMES]
        # execute stage (formal wrapper)
        self.x_valid = Signal()
        self.x_cmd = Signal(self.cmd_layout)
        self.x_fire = Signal()               # the x_ command executes this cycle
        self.x_go = Signal()                 # ... it may, once o is free (x_go_q & ~x_kill: flip-flops)
        self.x_go_ref = Signal()             # the same from its definition (formal check)
        self.x_victim = Signal(range(S))
        self.x_error = Signal(TagErrorCode)
        self.x_rsp = Signal(self.rsp_layout)  # stage 1 of its response (the slot fields: stage 2)
        # response stage and output queue (formal wrapper)
        self.r_valid = Signal()              # the response stage holds the command fired last cycle
        self.r_base = Signal(self.rsp_layout)
        self.r_rsp = Signal(self.rsp_layout)  # its final response (enters the output queue now)
        self.skid = Signal(self.rsp_layout, name="o_skid")
        self.skid_valid = Signal(name="o_skid_valid")

    def params(self) -> dict:
        return dict(slots=self.slots, layer_bits=self.layer_bits, expert_bits=self.expert_bits,
                    hot_bits=self.hot_bits, decay_shift=self.decay_shift,
                    plane_bits=self.plane_bits, stat_bits=self.stat_bits, pin_bits=self.pin_bits)

    # -- small per-slot functions (one place each) --------------------------------
    def _saturating_add(self, hot, amount):
        # saturate on the carry out: one carry chain, no second comparison
        total = hot + amount
        return Mux(total[self.hot_bits], (1 << self.hot_bits) - 1, total[:self.hot_bits])

    def _victim_candidate(self, held, res, pins, disabled):
        """A slot ALLOCATE may take: enabled, and FREE or unpinned RESIDENT."""
        return ~disabled & (~held | (res & (pins == 0)))

    def _hit_state(self, res):
        """The state bit that makes a held slot a hit (RESIDENT)."""
        return res

    def elaborate(self, platform):
        m = Module()
        S, P = self.slots, self.victim_settle
        held, res = self.state_valid, self.state_resident
        tags, planes = self.state_tag, self.state_planes
        hot, pins = self.state_hot, self.state_pins
        dis = self.disabled
        pin_max = (1 << self.pin_bits) - 1
        Op, Err = TagOpcode, TagErrorCode
        tb_, pb_, sb_, vb_ = self.tag_bits, self.plane_bits, self.slot_bits, self.value_bits

        def any_of(vec):
            return _or_tree(list(vec), 1)

        def pick(vec, values, width):
            """OR of ``values[s]`` where the one-hot ``vec[s]`` is set (a balanced tree)."""
            return _or_tree([Mux(vec[s], values[s], 0) for s in range(S)], width)

        def vec(name):
            return [Signal(name=f"{name}{s}") for s in range(S)]

        # ---- slot state as commands see it: the registers ------------------------
        # A command in cycle t sees the registers at the start of t; ``disabled``
        # and ``commit`` of cycle t act at the edge that ends t, after it.
        cm = vec("cm")
        for s in range(S):
            m.d.comb += cm[s].eq(self.commit.valid & (self.commit.slot == s))
        m.d.comb += [self.resident.eq(Cat(held[s] & res[s] & ~dis[s] for s in range(S))),
                     self.pending.eq(Cat(held[s] & ~res[s] & ~dis[s] for s in range(S)))]
        pins_zero = [pins[s] == 0 for s in range(S)]
        pins_full = [pins[s] == pin_max for s in range(S)]
        hit_st = [self._hit_state(res[s]) for s in range(S)]        # a held slot is a hit

        # ---- input register slice and the execute stage's registers --------------
        m.submodules.c = c = RegisterSlice(self.cmd_layout)
        wiring.connect(m, wiring.flipped(self.i), c.i)
        cp = c.o.payload
        x_valid, x, fire = self.x_valid, self.x_cmd, self.x_fire
        x_age = Signal()                         # x_ command has waited >= 1 cycle
        x_cmp = Signal(S)                        # tags[s] == x.tag (any state)
        x_sel = Signal(S)                        # one-hot of x.slot (0 when >= S)
        x_ssel = Signal(len(TAG_STAT_NAMES))     # STATS: one-hot of the counter (0 if bad)
        x_slot_bad = Signal()
        x_stat_bad = Signal()                    # STATS index beyond the counters
        ops = [Op.LOOKUP, Op.TOUCH, Op.DECAY, Op.ALLOCATE, Op.INVALIDATE, Op.PIN, Op.UNPIN,
               Op.RESET, Op.STATS, Op.LOOKUP_PIN, Op.INVALIDATE_SLOT, Op.INVALIDATE_MASK,
               Op.ABORT]
        x_is = {op: Signal(name=f"x_is_{op.name.lower()}") for op in ops}
        I = x_is
        # Opcode classes, registered with the opcode so that every per-slot term
        # below is a small function of flip-flops (no opcode decode on a path).
        two_ops = (Op.LOOKUP_PIN, Op.INVALIDATE, Op.INVALIDATE_SLOT, Op.PIN, Op.UNPIN, Op.ABORT)
        settle_ops = (Op.ALLOCATE, Op.INVALIDATE_MASK)
        classes = {
            "two": two_ops, "settle": settle_ops,
            "bad_op": (),                                          # filled below
            "chg": tuple(op for op in ops if op not in (Op.LOOKUP, Op.STATS)),
            "cnt": (Op.LOOKUP, Op.LOOKUP_PIN, Op.ALLOCATE, Op.ABORT),
            "tag2": (Op.LOOKUP_PIN, Op.INVALIDATE),                # two-cycle, names by tag
            "slot2": (Op.INVALIDATE_SLOT, Op.ABORT, Op.PIN, Op.UNPIN),   # ... by slot
            "errbad": (Op.LOOKUP_PIN, Op.INVALIDATE, Op.INVALIDATE_SLOT, Op.PIN, Op.UNPIN),
            "r_cmp": (Op.LOOKUP, Op.TOUCH, Op.LOOKUP_PIN, Op.INVALIDATE),
            "r_slot": (Op.INVALIDATE_SLOT, Op.ABORT),
            "r_hot": (Op.LOOKUP, Op.TOUCH, Op.LOOKUP_PIN),
            "r_pin": (Op.PIN, Op.UNPIN),
            "r_tag": (Op.INVALIDATE, Op.INVALIDATE_SLOT, Op.ABORT),
        }
        k = {n: Signal(name=f"x_k_{n}") for n in classes}
        x_two, x_settle = k["two"], k["settle"]
        load = Signal()
        alloc = vec("alloc")                     # ALLOCATE writes slot s (executes now)
        alloc_nf = vec("alloc_nf")               # ... the same without ``fire`` (forwarding)
        m.d.comb += [load.eq(~x_valid | fire), c.o.ready.eq(load)]
        with m.If(load):
            m.d.sync += [x_valid.eq(c.o.valid), x.eq(cp), x_age.eq(0),
                         x_slot_bad.eq(cp.slot >= S),
                         x_stat_bad.eq(cp.slot >= len(TAG_STAT_NAMES))]
            # the tag match, forwarding the tag an executing ALLOCATE writes now
            # (``alloc_nf`` equals ``alloc`` whenever a command loads behind it)
            same_tag = x.tag == cp.tag
            m.d.sync += x_cmp.eq(Cat(Mux(alloc_nf[s], same_tag, tags[s] == cp.tag)
                                     for s in range(S)))
            m.d.sync += x_sel.eq(Cat(cp.slot == s for s in range(S)))
            m.d.sync += x_ssel.eq(Cat((cp.op == Op.STATS) & (cp.slot == j)
                                      for j in range(len(TAG_STAT_NAMES))))
            m.d.sync += [x_is[op].eq(cp.op == op) for op in ops]
            for n, members in classes.items():
                if n == "bad_op":
                    m.d.sync += k[n].eq(~Cat(cp.op == op for op in ops).any())
                else:
                    m.d.sync += k[n].eq(Cat(cp.op == op for op in members).any())
        with m.Elif(x_valid):
            m.d.sync += x_age.eq(1)

        # ---- victim: free-running pipelined argmin over the slot state ---------
        # Every node carries its candidate bit, key, index, the index one-hot
        # (over the slots below it) and the tag of the slot it picked, so the
        # root's registers hold the victim's index, one-hot and tag directly:
        # no S-way mux behind the root. The leaves' tags are the tag registers
        # themselves (no copy; they are frozen while an ALLOCATE settles).
        kb = self.hot_bits + 1
        tb = self.tag_bits
        nodes = []
        for s in range(S):
            cand, key = Signal(name=f"v0_cand{s}"), Signal(kb, name=f"v0_key{s}")
            m.d.sync += [cand.eq(self._victim_candidate(held[s], res[s], pins[s], dis[s])),
                         key.eq(Mux(held[s], Cat(hot[s], Const(1, 1)), 0))]
            nodes.append((cand, key, Const(s, self.index_bits), Const(1, 1), tags[s]))
        level = 0
        while len(nodes) > 1:
            nxt = []
            reg = (level + 1) % self.LEVELS_PER_STAGE == 0 or len(nodes) <= 2
            dom = m.d.sync if reg else m.d.comb
            for j in range(0, len(nodes) - 1, 2):
                (lc, lk, li, lh, lt), (rc, rk, ri, rh, rt) = nodes[j], nodes[j + 1]
                take_r = rc & (~lc | (rk < lk))
                nm = f"v{level + 1}_{{}}{j // 2}"
                c_, k_ = Signal(name=nm.format("cand")), Signal(kb, name=nm.format("key"))
                i_ = Signal(self.index_bits, name=nm.format("idx"))
                h_ = Signal(len(lh) + len(rh), name=nm.format("hot"))
                t_ = Signal(tb, name=nm.format("tag"))
                dom += [c_.eq(lc | rc), k_.eq(Mux(take_r, rk, lk)), i_.eq(Mux(take_r, ri, li)),
                        h_.eq(Cat(Mux(take_r, 0, lh), Mux(take_r, rh, 0))),
                        t_.eq(Mux(take_r, rt, lt))]
                nxt.append((c_, k_, i_, h_, t_))
            if len(nodes) % 2:
                lc, lk, li, lh, lt = nodes[-1]
                if reg:                          # keep the odd leaf in step with its level
                    nm = f"v{level + 1}_{{}}_odd"
                    c_, k_ = Signal(name=nm.format("cand")), Signal(kb, name=nm.format("key"))
                    i_ = Signal(self.index_bits, name=nm.format("idx"))
                    h_ = Signal(len(lh), name=nm.format("hot"))
                    t_ = Signal(tb, name=nm.format("tag"))
                    dom += [c_.eq(lc), k_.eq(lk), i_.eq(li), h_.eq(lh), t_.eq(lt)]
                    nxt.append((c_, k_, i_, h_, t_))
                else:
                    nxt.append(nodes[-1])
            nodes, level = nxt, level + 1
        v_cand, v_key, v_idx, v_hot, v_tag = nodes[0]
        v_evict = v_key[self.hot_bits]           # the victim holds a RESIDENT tag
        m.d.comb += self.x_victim.eq(v_idx)

        # ---- when a command may execute ----------------------------------------------
        # Three classes: LOOKUP, TOUCH, DECAY, RESET, STATS and bad opcodes cannot
        # fail on slot state and execute at once; the ops that can (LOOKUP_PIN,
        # INVALIDATE, INVALIDATE_SLOT, PIN, UNPIN, ABORT: "two") take their error
        # and per-slot write enables from registers filled in their first cycle
        # here; ALLOCATE and INVALIDATE_MASK ("settle") also use the victim
        # pipeline and wait until it has seen the current state.
        two, settle = x_two, x_settle
        quiet = Signal(range(P + 1))
        # ``quiet == P`` and ``quiet != 0`` as flip-flops of their own, so that
        # ``fire`` is a shallow function of registers and ``o.ready``
        quiet_full, quiet_nz = Signal(), Signal()
        dis_q = Signal(S)
        dis_change = Signal()
        m.d.sync += dis_q.eq(dis)
        m.d.comb += dis_change.eq(any_of([dis[s] ^ dis_q[s] for s in range(S)]))
        ev_change = Signal()                     # a state change with no command: the inputs
        m.d.comb += ev_change.eq(self.commit.valid | dis_change)
        change = (fire & k["chg"]) | ev_change
        m.d.sync += [quiet.eq(Mux(change, 0, Mux(quiet == P, P, quiet + 1))),
                     quiet_full.eq(~change & (quiet >= P - 1)), quiet_nz.eq(~change)]
        settled, steady = Signal(), Signal()
        m.d.comb += [settled.eq(x_age & quiet_full), steady.eq(x_age & quiet_nz)]

        # registered summaries for ALLOCATE / INVALIDATE_MASK (valid once settled)
        a_res_q, a_pend_q, k_pinned_q = Signal(), Signal(), Signal()
        # ALLOCATE, and no slot holds its tag (like every registered term of the
        # x_ command below, it belongs to that command once it has waited a
        # cycle - ``x_age``; ALLOCATE executes only then)
        alloc_pre_q = Signal()
        m.d.sync += [
            a_res_q.eq(any_of([x_cmp[s] & held[s] & res[s] for s in range(S)])),
            a_pend_q.eq(any_of([x_cmp[s] & held[s] & ~res[s] for s in range(S)])),
            alloc_pre_q.eq(I[Op.ALLOCATE] & ~any_of([x_cmp[s] & held[s] for s in range(S)])),
            k_pinned_q.eq(any_of([x.slot_mask[s] & held[s] & ~pins_zero[s]
                                  for s in range(S)])),
        ]
        g_alloc = alloc_pre_q & v_cand           # ALLOCATE succeeds (once settled, x_age)
        g_mask = I[Op.INVALIDATE_MASK] & ~k_pinned_q

        # ---- two-cycle ops: per-slot vectors registered in every cycle ---------------
        # From the x_ command and the state of this cycle; a two-cycle op
        # executes only in a cycle after one in x_ without a state change
        # (``steady``), so then these registers are exactly its terms: the slot
        # it names (``nm``), whether that slot makes it fail (``bad``) or is the
        # one it needs (``fnd``: held; for ABORT, PENDING), and its per-slot
        # write enables. Every write enable below is ``fire`` AND a register.
        nm = vec("nm")
        for s in range(S):
            m.d.comb += nm[s].eq(((k["tag2"] & x_cmp[s]) | (k["slot2"] & x_sel[s])) & held[s])
        up_q, dn_q, fr_q = Signal(S, name="pin_up_q"), Signal(S, name="pin_down_q"), \
            Signal(S, name="free_two_q")
        bad_q, fnd_q = Signal(S, name="bad_q"), Signal(S, name="fnd_q")
        inv_any = I[Op.INVALIDATE] | I[Op.INVALIDATE_SLOT]
        m.d.sync += [
            up_q.eq(Cat(nm[s] & ~pins_full[s] & ((I[Op.LOOKUP_PIN] & hit_st[s]) | I[Op.PIN])
                        for s in range(S))),
            dn_q.eq(Cat(nm[s] & ~pins_zero[s] & I[Op.UNPIN] for s in range(S))),
            fr_q.eq(Cat(nm[s] & ((inv_any & pins_zero[s]) | (I[Op.ABORT] & ~res[s]))
                        for s in range(S))),
            bad_q.eq(Cat(nm[s] & ((I[Op.LOOKUP_PIN] & hit_st[s] & pins_full[s])
                                  | (inv_any & ~pins_zero[s]) | (I[Op.PIN] & pins_full[s])
                                  | (I[Op.UNPIN] & pins_zero[s])) for s in range(S))),
            fnd_q.eq(Cat(nm[s] & ~(I[Op.ABORT] & res[s]) for s in range(S))),
        ]
        e_bad, e_fnd = Signal(name="two_bad"), Signal(name="two_fnd")
        m.d.comb += [e_bad.eq(bad_q.any()), e_fnd.eq(fnd_q.any())]

        # ---- statistics: increments registered, added one cycle later ------------
        names = TAG_STAT_NAMES
        inc = {n: Signal(range(S + 1) if n == "kv_frees" else 1, name=f"inc_{n}") for n in names}
        inc_any = Signal()                       # a 1-bit increment may be in flight
        inc_any_cm = Signal()                    # a commit strobe was valid last cycle
        m.d.sync += inc_any_cm.eq(self.commit.valid)
        # slots freed by ``disabled`` are counted ``1 + kv_count_stages`` cycles
        # late: their mask is registered first (kv_q), then counted by a
        # pipelined popcount (``kv_count_stages`` register stages, the last one
        # inc_kv_frees), then added; kv_any[j] (a change of ``disabled`` j + 1
        # cycles ago) covers them for STATS (a slot is freed by ``disabled``
        # only in a cycle in which ``disabled`` changed: ALLOCATE never takes a
        # covered slot)
        kv_q = Signal(S)
        kv_any = [Signal(name=f"kv{j + 1}_any") for j in range(1 + self.kv_count_stages)]
        # commits are counted from registered pieces (the strobe, ``res`` and the
        # ALLOCATE of the cycle), then counted, then added; ``inc_any`` also
        # covers every commit strobe of the previous cycle and cm2 the one before
        cm_q, res_q, alloc_q = Signal(S, name="cm_q"), Signal(S, name="res_q"), \
            Signal(S, name="alloc_q")
        cm2 = Signal()
        stats_quiet = Signal()
        m.d.comb += stats_quiet.eq(~inc_any & ~Cat(*kv_any).any() & ~cm2)

        can_out = ~self.o.valid | self.o.ready
        waits = (settle & ~settled) | (two & ~steady) | (I[Op.STATS] & ~stats_quiet)
        # ``x_go`` = "the x_ command may execute once o is free" = x_go_q & ~x_kill,
        # two flip-flops loaded with the next cycle's value of ``x_valid & ~waits``
        # (the reference, kept for the formal wrapper, which asserts they are
        # equal): x_kill takes the terms that come from this cycle's inputs
        # (a commit strobe, a change of ``disabled``), x_go_q the rest, so
        # ``fire`` is one LUT of registers and ``o.ready``
        x_go_q, x_kill = Signal(name="x_go_q"), Signal(name="x_kill")
        x_go = self.x_go
        m.d.comb += [x_go.eq(x_go_q & ~x_kill), self.x_go_ref.eq(x_valid & ~waits),
                     fire.eq(x_go_q & ~x_kill & can_out)]
        # a two-cycle op's registered vectors belong to the x_ command only once it
        # has waited a cycle; the op only ever executes then
        fire2 = Signal(name="fire2")
        m.d.comb += fire2.eq(x_go_q & ~x_kill & can_out & x_age)

        # ---- errors ----------------------------------------------------------------------
        def errors(conds):
            return (_or_tree([Mux(c_, Const(e.value, 4), 0) for c_, e in conds], 4),
                    _or_tree([c_ for c_, _ in conds], 1))
        code, err_any = errors([
            (I[Op.ALLOCATE] & a_res_q, Err.RESIDENT),
            (I[Op.ALLOCATE] & ~a_res_q & a_pend_q, Err.PENDING),
            (I[Op.ALLOCATE] & ~a_res_q & ~a_pend_q & ~v_cand, Err.NO_VICTIM),
            (I[Op.INVALIDATE_MASK] & k_pinned_q, Err.PINNED),
            (I[Op.STATS] & x_stat_bad, Err.BAD_SLOT),
            (k["bad_op"], Err.BAD_OP),
            (k["slot2"] & x_slot_bad, Err.BAD_SLOT),
            ((I[Op.PIN] | I[Op.UNPIN]) & ~x_slot_bad & ~e_fnd, Err.NOT_VALID),
            (I[Op.ABORT] & ~x_slot_bad & ~e_fnd, Err.NOT_PENDING),
            ((I[Op.LOOKUP_PIN] | I[Op.PIN]) & e_bad, Err.PIN_LIMIT),
            (inv_any & e_bad, Err.PINNED),
            (I[Op.UNPIN] & e_bad, Err.NOT_PINNED),
        ])
        m.d.comb += self.x_error.eq(code)
        fail_bad = k["errbad"] & e_bad           # a two-cycle op fails on its named slot

        # ---- response, stage 1 (the execute cycle) --------------------------------------
        # Fields that do not come from a slot: the opcode, the error, ALLOCATE's
        # victim (registers at the argmin root), the STATS counter, the slot of
        # the slot-addressed ops (zeroed on error in stage 2), INVALIDATE_MASK's
        # mask. Each is an AND-OR of registered one-hot opcode terms.
        def field(*terms, width):
            return _or_tree([Mux(cond, v, 0) for cond, v in terms], width)

        r = self.x_rsp
        stat_sel = _or_tree([Mux(x_ssel[j], self.counters[j], 0) for j in range(len(x_ssel))],
                            self.stat_bits)
        m.d.comb += [
            r.op.eq(x.op),
            r.error.eq(code),
            r.slot.eq(field((I[Op.ALLOCATE], v_idx), (k["slot2"] | I[Op.STATS], x.slot),
                            width=sb_)),
            r.evicted.eq(I[Op.ALLOCATE] & g_alloc & v_evict),
            r.evicted_tag.eq(Mux(I[Op.ALLOCATE] & g_alloc & v_evict, v_tag, 0)),
            r.value.eq(stat_sel),
            r.slot_mask.eq(Mux(g_mask, x.slot_mask & Cat(*held), 0)),
        ]

        # Stage 2 (the cycle after): the response stage never holds (its
        # content always moves into the output queue), so the slot registers
        # it reads are exactly the state the command left: ``hot`` is the new
        # hotness of a TOUCH (the old one of a LOOKUP, which writes nothing),
        # ``pins`` the new pin count of a PIN / UNPIN, ``planes`` and ``tags``
        # unchanged (only ALLOCATE writes them; freeing clears ``held`` alone).
        # What the command saw in its cycle leaves the execute stage as one-hot
        # vectors over the slots, already zero on an error: the slot it reports
        # (``r_sel``), RESIDENT / PENDING (``r_res`` / ``r_pnd``), and whose
        # hotness / pin count is the ``value`` (``r_hot`` / ``r_pin``). No adder
        # and no error decision on a response path.
        rv, rb = self.r_valid, self.r_base
        r_sel, r_res, r_pnd = Signal(S, name="r_sel"), Signal(S, name="r_res"), \
            Signal(S, name="r_pnd")
        r_hot, r_pin = Signal(S, name="r_hot"), Signal(S, name="r_pin")
        r_tag, r_ok = Signal(name="r_tag"), Signal(name="r_ok")
        named_r = [(k["r_cmp"] & x_cmp[s]) | (k["r_slot"] & x_sel[s]) for s in range(S)]
        hp = [(k["r_cmp"] & x_cmp[s]) | (I[Op.INVALIDATE_SLOT] & x_sel[s]) for s in range(S)]
        m.d.sync += [
            rv.eq(fire), rb.eq(r), r_ok.eq(~err_any), r_tag.eq(k["r_tag"]),
            r_sel.eq(Cat(named_r[s] & held[s] & ~(I[Op.ABORT] & res[s]) & ~fail_bad
                         for s in range(S))),
            r_res.eq(Cat(hp[s] & held[s] & hit_st[s] & ~fail_bad for s in range(S))),
            r_pnd.eq(Cat(hp[s] & held[s] & ~res[s] & ~fail_bad for s in range(S))),
            r_hot.eq(Cat(k["r_hot"] & x_cmp[s] & held[s] & ~fail_bad for s in range(S))),
            r_pin.eq(Cat(k["r_pin"] & x_sel[s] & held[s] & ~fail_bad for s in range(S))),
        ]
        fin = self.r_rsp
        m.d.comb += [
            fin.op.eq(rb.op),
            fin.error.eq(rb.error),
            fin.hit.eq(r_res.any()),
            fin.pending.eq(r_pnd.any()),
            fin.slot.eq(Mux(r_ok, rb.slot, 0) | pick(r_sel, [Const(s, sb_) for s in range(S)],
                                                   sb_)),
            fin.planes.eq(pick(r_sel, planes, pb_)),
            fin.evicted.eq(rb.evicted | (r_tag & r_sel.any())),
            fin.evicted_tag.eq(rb.evicted_tag | Mux(r_tag, pick(r_sel, tags, tb_), 0)),
            fin.value.eq(rb.value | pick(r_hot, hot, vb_) | pick(r_pin, pins, vb_)),
            fin.slot_mask.eq(rb.slot_mask),
        ]
        # Output queue of two (``o`` and a skid register): a command executes
        # only when ``o`` is free in that cycle (``can_out``), so the response
        # stage always finds room, and ``o`` stalls execution only when full.
        sk, sk_valid = self.skid, self.skid_valid
        pop = self.o.valid & self.o.ready
        with m.If(sk_valid):
            with m.If(pop):
                m.d.sync += [self.o.payload.eq(sk), sk_valid.eq(rv), sk.eq(fin)]
        with m.Elif(~self.o.valid | pop):
            m.d.sync += [self.o.valid.eq(rv), self.o.payload.eq(fin)]
        with m.Else():
            m.d.sync += [sk_valid.eq(rv), sk.eq(fin)]

        # ---- state update: per-slot write enables ---------------------------------
        # ``fire`` AND registers: the one-hot opcode, the registered tag match,
        # the slot's state bits, the victim's one-hot and the two-cycle vectors.
        reset_go = fire & I[Op.RESET]
        freed = vec("freed")                     # by the command
        for s in range(S):
            m.d.comb += [
                freed[s].eq((fire & (I[Op.RESET] | (g_mask & x.slot_mask[s])))
                            | (fire2 & fr_q[s])),
                alloc_nf[s].eq(x_valid & x_age & g_alloc & v_hot[s]),
                alloc[s].eq(fire2 & g_alloc & v_hot[s]),
            ]
            hot_we = alloc[s] | (fire & (I[Op.DECAY] | (I[Op.TOUCH] & x_cmp[s] & held[s])))
            hot_d = Mux(I[Op.ALLOCATE], x.amount,
                        Mux(I[Op.DECAY], hot[s] - (hot[s] >> self.decay_shift),
                            self._saturating_add(hot[s], x.amount)))
            with m.If(hot_we):
                m.d.sync += hot[s].eq(hot_d)
            pins_we = alloc[s] | (fire2 & (up_q[s] | dn_q[s]))
            pins_d = Mux(I[Op.ALLOCATE], 1, Mux(up_q[s], pins[s] + 1, pins[s] - 1))
            with m.If(pins_we):
                m.d.sync += pins[s].eq(pins_d)
            # any strobe sets ``res``: a slot that holds no tag (FREE, or freed by
            # this cycle's command or ``disabled``) ignores it - its ``res`` is
            # unobservable until the next ALLOCATE writes it - so the command's
            # free terms stay off ``res``; the commits statistic is exact (below)
            with m.If(alloc[s]):
                m.d.sync += [held[s].eq(1), res[s].eq(cm[s] & ~dis[s]), tags[s].eq(x.tag),
                             planes[s].eq(x.planes)]
            with m.Elif(cm[s]):
                m.d.sync += res[s].eq(1)
            with m.If(freed[s] | dis[s]):           # after the command: ``disabled``
                m.d.sync += held[s].eq(0)

        # ---- statistics -------------------------------------------------------------
        m_hit = any_of([x_cmp[s] & held[s] & hit_st[s] for s in range(S)])
        m_pend = any_of([x_cmp[s] & held[s] & ~res[s] for s in range(S)])
        # LOOKUP_PIN's only error is PIN_LIMIT (``e_bad``)
        lk = fire & (I[Op.LOOKUP] | (I[Op.LOOKUP_PIN] & ~e_bad))
        alloc_go = fire2 & g_alloc
        # a slot the command frees in this cycle is not freed again by the
        # cycle's ``disabled`` (step order: command, then disabled)
        kv = Cat(((held[s] & ~freed[s]) | alloc[s]) & dis[s] for s in range(S))
        # an effective commit of the last cycle: its slot holds a tag now (not
        # freed by that cycle's command or ``disabled``) and was PENDING before
        # it (or just allocated)
        ce = Cat(cm_q[s] & held[s] & (~res_q[s] | alloc_q[s]) for s in range(S))
        # the popcount of kv_q: its first kv_count_stages - 1 stages here, the
        # last one into inc_kv_frees below (cleared with the counters by RESET)
        kv_count, kv_pipe = _popcount_pipeline(m, kv_q, self.KV_ADDER_LEVELS_PER_STAGE,
                                               clear=reset_go)
        assert len(kv_pipe) == self.kv_count_stages - 1
        new = {"lookups": lk, "hits": lk & m_hit, "pending": lk & m_pend,
               "allocations": alloc_go, "evictions": alloc_go & v_evict,
               "commits": ce.any(),
               "aborts": fire & I[Op.ABORT] & ~x_slot_bad & e_fnd,
               "kv_frees": kv_count}
        m.d.sync += [cm_q.eq(Cat(cm)), res_q.eq(Cat(res)), alloc_q.eq(Cat(alloc)),
                     cm2.eq(inc_any_cm)]
        smax = (1 << self.stat_bits) - 1
        with m.If(reset_go):
            m.d.sync += [cnt.eq(0) for cnt in self.counters]
            m.d.sync += [inc[n].eq(0) for n in names] + [inc_any.eq(0), kv_q.eq(0)]
            m.d.sync += [a.eq(0) for a in kv_any]
        with m.Else():
            for j, n in enumerate(names):
                cnt = self.counters[j]
                iw = inc[n].shape().width
                total = Signal(max(self.stat_bits, iw) + 1, name=f"stat_sum_{n}")
                m.d.comb += total.eq(cnt + inc[n])
                # saturate on the carry out when the increment is no wider than the counter
                over = total[self.stat_bits] if iw <= self.stat_bits else total > smax
                m.d.sync += [cnt.eq(Mux(over, smax, total[:self.stat_bits])), inc[n].eq(new[n])]
            # a superset of the 1-bit increments loaded now (kept shallow: one
            # AND with ``fire``); it only makes STATS wait
            m.d.sync += [inc_any.eq((fire & k["cnt"]) | self.commit.valid),
                         kv_q.eq(kv), kv_any[0].eq(dis_change)]
            m.d.sync += [kv_any[j + 1].eq(kv_any[j]) for j in range(len(kv_any) - 1)]
        # ---- x_go for the next cycle ---------------------------------------------
        # "statistics quiet" next cycle, split into the part from registers
        # (sq_reg) and the inputs of this cycle (``ev_change``, in x_kill); exact
        # whenever the next x_ command is a STATS (it then follows a command
        # that executed or an empty x_, so the terms need no ``fire``)
        after_reset = x_valid & I[Op.RESET]          # executes now if a STATS loads behind it
        # (next cycle kv_any[j + 1] is this cycle's kv_any[j]; kv_any[0] is ev_change's)
        kv_next = Cat(*kv_any[:-1]).any()
        sq_reg = Mux(after_reset, ~inc_any_cm, ~(x_valid & k["cnt"]) & ~kv_next & ~inc_any_cm)
        cp_wait = Cat(cp.op == op for op in two_ops + settle_ops).any()
        cp_stats = cp.op == Op.STATS
        go_load = c.o.valid & ~cp_wait & ~(cp_stats & ~sq_reg)
        go_hold = x_valid & ~(settle & (quiet < P - 1)) & ~(I[Op.STATS] & ~sq_reg)
        next_stats = Mux(load, c.o.valid & cp_stats, x_valid & I[Op.STATS])
        m.d.sync += [x_go_q.eq(Mux(load, go_load, go_hold)),
                     x_kill.eq(ev_change & ((~load & (two | settle))
                                            | (next_stats & ~(load & after_reset))))]
        return m


def _or_tree(terms: list, width: int):
    """OR of ``terms`` as a balanced tree, ``width`` bits wide (the synthesis
    flow does not rebalance a long chain of ORs)."""
    if not terms:
        return Const(0, width)
    terms = [t for t in terms]
    while len(terms) > 1:
        terms = [terms[j] | terms[j + 1] if j + 1 < len(terms) else terms[j]
                 for j in range(0, len(terms), 2)]
    return terms[0][:width]


def _count4(bits):
    """Number of set bits among up to four 1-bit values, as plain logic (each
    result bit is one LUT4 of the inputs; ``+`` would become carry chains)."""
    a, b, c, d = (list(bits) + [Const(0, 1)] * 4)[:4]
    x1, x2, p, q = a ^ b, c ^ d, a & b, c & d         # a + b = {p, x1}, c + d = {q, x2}
    c0 = x1 & x2
    return Cat(x1 ^ x2, p ^ q ^ c0, (p & q) | ((p ^ q) & c0))


def popcount_levels(width: int) -> int:
    """Adder levels of :func:`_popcount_pipeline` over ``width`` bits: the
    4-bit counts of its leaves, then a balanced binary tree of adders."""
    return max(0, math.ceil(math.log2(max(1, math.ceil(width / 4)))))


def popcount_stages(width: int, levels_per_stage: int) -> int:
    """Register stages of :func:`_popcount_pipeline`: the leaves' 4-bit counts
    and up to ``levels_per_stage`` adder levels in the first, as many in each
    later one (at least one stage)."""
    return max(1, math.ceil(popcount_levels(width) / levels_per_stage))


def _popcount_pipeline(m, v, levels_per_stage: int, *, clear):
    """Number of set bits of ``v``: 4-bit counts as plain logic, then a
    balanced adder tree with a register after every ``levels_per_stage``
    adder levels except the last. Returns the count (combinational, the
    caller registers it: :func:`popcount_stages` stages in all) and the list
    of the pipeline's registers (cleared when ``clear`` is 1)."""
    terms = [_count4([v[k] for k in range(j, min(j + 4, len(v)))])
             for j in range(0, len(v), 4)]
    regs, level = [], 0
    while len(terms) > 1:
        terms = [terms[j] + terms[j + 1] if j + 1 < len(terms) else terms[j]
                 for j in range(0, len(terms), 2)]
        level += 1
        if level % levels_per_stage == 0 and len(terms) > 1:
            staged = []
            for j, t in enumerate(terms):
                r = Signal(len(t), name=f"kv_cnt{len(regs)}_{j}")
                m.d.sync += r.eq(Mux(clear, 0, t))
                staged.append(r)
            regs.append(staged)
            terms = staged
    return terms[0], regs


def _tag_params(cfg) -> dict:
    return tag_unit_params(cfg)


def _register():
    from ..blocks import Block
    return [
        Block("tag_unit", "elmoe3d_tag_unit",
              "expert-cache tag unit: {layer, expert} -> slot, FREE/PENDING/RESIDENT, hotness, "
              "pins, KV-disabled slots, 1 lookup/cycle",
              _tag_params, TagUnit, order=30,
              timing=f"1 LOOKUP/TOUCH per cycle, response {TagUnit.LATENCY} cycles after the "
                     f"command; pins, invalidates, ALLOCATE: 5 cycles",
              sweep=(dict(tag_slots=8), dict(tag_slots=32, hb_words=16384),
                     dict(tag_slots=128, hb_words=65536))),
    ]


BLOCK_SPECS = _register()
