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
  commits and slots freed by ``disabled`` two): 4 cycles right behind a
  counted command, up to 5 behind a commit strobe or a KV move.
* **two-cycle** - LOOKUP_PIN, INVALIDATE, INVALIDATE_SLOT, PIN, UNPIN, ABORT can
  fail on slot state (pin limit, pinned, not valid, not pending). In their
  first cycle in ``x_`` the response and error are computed and registered;
  they execute in a later cycle in which nothing changed the state since
  (their second, unless a commit strobe or a ``disabled`` change arrived):
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
not an S-way mux behind the root. The two-cycle ops' ``evicted_tag`` is
picked by the slot one-hot alone and gated by the registered ``evicted``
bit in the execute cycle.

Per-slot updates are local: every slot computes its own saturating
``hot + amount``, ``hot - (hot >> d)`` and pin increment, and its own write
enable from the registered tag match, its state bits and the one-hot
decoded opcode and slot of the command. Freeing a slot clears only its
"holds a tag" bit (its other fields are unobservable until the next
ALLOCATE overwrites them). Every response field is an OR of per-opcode terms
gated by the registered one-hot opcode; the LOOKUP / TOUCH terms over the
slots (hit, pending, slot, planes, hotness) leave the execute stage as two
registered one-hot vectors and are picked in the response stage, from the
slot registers as the command left them (a TOUCH's new hotness is then the
register itself: no adder on the response path); the timing class of the command
(single-cycle / two-cycle / settling) and the "state quiet for P cycles"
test are flip-flops, and so is ``x_go`` ("valid and not waiting", loaded
with its next-cycle value; the formal wrapper asserts it equals its
definition), so ``fire`` (the command executes) is one LUT from ``x_go`` and
``o.valid`` / ``o.ready``; the victim's index is also registered one-hot for
the per-slot ALLOCATE write enables. Statistics counters add their increments one
cycle after the event (effective commit strobes and slots freed by
``disabled``: two), saturating on the carry out.
"""

from __future__ import annotations

import math

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..golden import tag_unit as gtu
from .streams import RegisterSlice
from .vocab import TagErrorCode, TagOpcode, bits, slot_strobe, tag_command, tag_response

__all__ = ["TagOpcode", "TagErrorCode", "TagUnit", "value_bits"]

value_bits = gtu.value_bits


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

    def __init__(self, *, slots: int = 16, layer_bits: int = 6, expert_bits: int = 7,
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
        self.index_bits = bits(slots)
        self.value_bits = gtu.value_bits(hot_bits, stat_bits, pin_bits)
        self.cmd_layout = tag_command(slots, self.tag_bits, hot_bits, plane_bits)
        self.rsp_layout = tag_response(slots, self.tag_bits, plane_bits, self.value_bits)
        self.victim_levels = max(1, math.ceil(math.log2(slots)))
        self.victim_settle = 1 + math.ceil(self.victim_levels / self.LEVELS_PER_STAGE)
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
        self.counters = [Signal(stat_bits, name=f"stat_{n}") for n in gtu.STAT_NAMES]
        # execute stage (formal wrapper)
        self.x_valid = Signal()
        self.x_cmd = Signal(self.cmd_layout)
        self.x_fire = Signal()               # the x_ command executes this cycle
        self.x_go = Signal()                 # ... it may, once o is free (a flip-flop)
        self.x_go_ref = Signal()             # the same from its definition (formal check)
        self.x_victim = Signal(range(S))
        self.x_error = Signal(TagErrorCode)
        self.x_rsp = Signal(self.rsp_layout)  # stage 1 of its response (LOOKUP / TOUCH terms: stage 2)
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

        def any_of(vec):
            return _or_tree(list(vec), 1)

        def pick(vec, values, width):
            """OR of ``values[s]`` where the one-hot ``vec[s]`` is set (a balanced tree)."""
            return _or_tree([Mux(vec[s], values[s], 0) for s in range(S)], width)

        # ---- slot state as commands see it: the registers ------------------------
        # A command in cycle t sees the registers at the start of t; ``disabled``
        # and ``commit`` of cycle t act at the edge that ends t, after it.
        cm = [Signal(name=f"cm{s}") for s in range(S)]
        held_e = held                                               # holds a tag
        res_e = [Signal(name=f"res_e{s}") for s in range(S)]        # RESIDENT
        pend_e = [Signal(name=f"pend_e{s}") for s in range(S)]      # PENDING
        for s in range(S):
            m.d.comb += [cm[s].eq(self.commit.valid & (self.commit.slot == s)),
                         res_e[s].eq(held[s] & self._hit_state(res[s])),
                         pend_e[s].eq(held[s] & ~res[s])]
        m.d.comb += [self.resident.eq(Cat(held[s] & res[s] & ~dis[s] for s in range(S))),
                     self.pending.eq(Cat(held[s] & ~res[s] & ~dis[s] for s in range(S)))]

        # ---- input register slice and the execute stage's registers --------------
        m.submodules.c = c = RegisterSlice(self.cmd_layout)
        wiring.connect(m, wiring.flipped(self.i), c.i)
        cp = c.o.payload
        x_valid, x, fire = self.x_valid, self.x_cmd, self.x_fire
        x_age = Signal()                         # x_ command has waited >= 1 cycle
        x_cmp = Signal(S)                        # tags[s] == x.tag (any state)
        x_sel = Signal(S)                        # one-hot of x.slot (0 when >= S)
        x_slot_bad = Signal()
        x_stat_bad = Signal()                    # STATS index beyond the counters
        ops = [Op.LOOKUP, Op.TOUCH, Op.DECAY, Op.ALLOCATE, Op.INVALIDATE, Op.PIN, Op.UNPIN,
               Op.RESET, Op.STATS, Op.LOOKUP_PIN, Op.INVALIDATE_SLOT, Op.INVALIDATE_MASK,
               Op.ABORT]
        x_is = {op: Signal(name=f"x_is_{op.name.lower()}") for op in ops}
        # the timing class of the x_ command, registered with the opcode (see below)
        two_ops = (Op.LOOKUP_PIN, Op.INVALIDATE, Op.INVALIDATE_SLOT, Op.PIN, Op.UNPIN, Op.ABORT)
        settle_ops = (Op.ALLOCATE, Op.INVALIDATE_MASK)
        x_two, x_settle = Signal(), Signal()
        load = Signal()
        alloc = [Signal(name=f"alloc{s}") for s in range(S)]        # ALLOCATE writes slot s
        m.d.comb += [load.eq(~x_valid | fire), c.o.ready.eq(load)]
        with m.If(load):
            m.d.sync += [x_valid.eq(c.o.valid), x.eq(cp), x_age.eq(0),
                         x_slot_bad.eq(cp.slot >= S),
                         x_stat_bad.eq(cp.slot >= len(gtu.STAT_NAMES))]
            # the tag match, forwarding the tag an executing ALLOCATE writes now
            same_tag = x.tag == cp.tag
            m.d.sync += x_cmp.eq(Cat(Mux(alloc[s], same_tag, tags[s] == cp.tag)
                                     for s in range(S)))
            m.d.sync += x_sel.eq(Cat(cp.slot == s for s in range(S)))
            m.d.sync += [x_is[op].eq(cp.op == op) for op in ops]
            m.d.sync += [x_two.eq(Cat(cp.op == op for op in two_ops).any()),
                         x_settle.eq(Cat(cp.op == op for op in settle_ops).any())]
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
        # fail on slot state and execute at once ("fast"); the ops that can
        # (LOOKUP_PIN, INVALIDATE, INVALIDATE_SLOT, PIN, UNPIN, ABORT: "two") take
        # their response and error from registers filled in their first cycle
        # here; ALLOCATE and INVALIDATE_MASK ("settle") also use the victim
        # pipeline and wait until it has seen the current state.
        I = x_is
        two, settle = x_two, x_settle
        quiet = Signal(range(P + 1))
        # ``quiet == P`` and ``quiet != 0`` as flip-flops of their own, so that
        # ``fire`` is a shallow function of registers and ``o.ready``
        quiet_full, quiet_nz = Signal(), Signal()
        dis_q = Signal(S)
        dis_change = Signal()
        m.d.sync += dis_q.eq(dis)
        m.d.comb += dis_change.eq(dis != dis_q)
        change = (fire & ~I[Op.LOOKUP] & ~I[Op.STATS]) | self.commit.valid | dis_change
        m.d.sync += [quiet.eq(Mux(change, 0, Mux(quiet == P, P, quiet + 1))),
                     quiet_full.eq(~change & (quiet >= P - 1)), quiet_nz.eq(~change)]
        settled, steady = Signal(), Signal()
        m.d.comb += [settled.eq(x_age & quiet_full), steady.eq(x_age & quiet_nz)]

        # registered summaries for ALLOCATE / INVALIDATE_MASK (valid once settled)
        a_res_q, a_pend_q, k_pinned_q = Signal(), Signal(), Signal()
        m.d.sync += [
            a_res_q.eq(any_of([x_cmp[s] & held_e[s] & res[s] for s in range(S)])),
            a_pend_q.eq(any_of([x_cmp[s] & held_e[s] & ~res[s] for s in range(S)])),
            k_pinned_q.eq(any_of([x.slot_mask[s] & held_e[s] & (pins[s] != 0)
                                  for s in range(S)])),
        ]

        # ---- statistics: increments registered, added one cycle later ------------
        names = gtu.STAT_NAMES
        inc = {n: Signal(range(S + 1) if n == "kv_frees" else 1, name=f"inc_{n}") for n in names}
        inc_any = Signal()                       # a 1-bit increment may be in flight
        inc_any_cm = Signal()                    # a commit strobe was valid last cycle
        m.d.sync += inc_any_cm.eq(self.commit.valid)
        # slots freed by ``disabled`` are counted two cycles late: their mask is
        # registered first (kv_q), then counted (inc_kv_frees), then added
        kv_q = Signal(S)
        kv1_any, kv2_any = Signal(), Signal()
        # commits are counted the same way: the effective strobe registered
        # (ce_q), then counted, then added; ``inc_any`` also covers every commit
        # strobe (effective or not) of the previous cycle and cm2 the one before
        ce_q = Signal(S)
        cm2 = Signal()
        stats_quiet = Signal()
        m.d.comb += stats_quiet.eq(~inc_any & ~kv1_any & ~kv2_any & ~cm2)

        can_out = ~self.o.valid | self.o.ready
        waits = (settle & ~settled) | (two & ~steady) | (I[Op.STATS] & ~stats_quiet)
        # ``x_go`` = "the x_ command may execute once o is free", a flip-flop
        # loaded with the next cycle's value of ``x_valid & ~waits`` (the
        # reference, kept for the formal wrapper, which asserts they are equal),
        # so ``fire`` is one LUT from registers and ``o.ready``
        x_go = self.x_go
        m.d.comb += [self.x_go_ref.eq(x_valid & ~waits), fire.eq(x_go & can_out)]

        # ---- per-slot terms of the x_ command ------------------------------------------
        hit_m = [Signal(name=f"hit_m{s}") for s in range(S)]        # x.tag held, per state
        held_m = [Signal(name=f"held_m{s}") for s in range(S)]
        pend_m = [Signal(name=f"pend_m{s}") for s in range(S)]
        sel_h = [Signal(name=f"sel_h{s}") for s in range(S)]        # x.slot holds a tag
        pins_zero = [pins[s] == 0 for s in range(S)]
        pins_full = [pins[s] == pin_max for s in range(S)]
        hot_new = [Signal(self.hot_bits, name=f"hot_new{s}") for s in range(S)]
        for s in range(S):
            m.d.comb += [held_m[s].eq(x_cmp[s] & held_e[s]),
                         hit_m[s].eq(x_cmp[s] & res_e[s]),
                         pend_m[s].eq(x_cmp[s] & pend_e[s]),
                         sel_h[s].eq(x_sel[s] & held_e[s]),
                         hot_new[s].eq(self._saturating_add(hot[s], x.amount))]
        m_any, m_hit, m_pend = any_of(held_m), any_of(hit_m), any_of(pend_m)
        m_slot = pick(held_m, [Const(s, self.slot_bits) for s in range(S)], self.slot_bits)
        m_planes = pick(held_m, planes, self.plane_bits)
        m_hot = pick(held_m, hot, self.hot_bits)
        lpin_full = any_of([hit_m[s] & pins_full[s] for s in range(S)])
        s_pins = pick(x_sel, pins, self.pin_bits)
        s_hit = any_of([x_sel[s] & res_e[s] for s in range(S)])
        s_pend = any_of([x_sel[s] & pend_e[s] for s in range(S)])
        s_held = any_of(sel_h)
        s_pinned = any_of([sel_h[s] & ~pins_zero[s] for s in range(S)])
        s_full = any_of([x_sel[s] & pins_full[s] for s in range(S)])
        s_zero = any_of([x_sel[s] & pins_zero[s] for s in range(S)])
        m_pinned = any_of([held_m[s] & ~pins_zero[s] for s in range(S)])
        slot_op = I[Op.PIN] | I[Op.UNPIN] | I[Op.ABORT] | I[Op.INVALIDATE_SLOT]
        bad_op = ~Cat(*x_is.values()).any()
        stat_sel = Array(self.counters)[x.slot[:3]]

        # The response and its error code as AND-OR of the registered one-hot
        # opcode: every field is an OR of per-opcode terms (no opcode decode on
        # the path); an error zeroes the fields through one gate.
        def field(*terms, width):
            return _or_tree([Mux(cond, v, 0) for cond, v in terms], width)

        def errors(conds):
            return (_or_tree([Mux(c, Const(e.value, 4), 0) for c, e in conds], 4),
                    _or_tree([c for c, _ in conds], 1))

        tb_, pb_, sb_, vb_ = self.tag_bits, self.plane_bits, self.slot_bits, self.value_bits
        lk_like = I[Op.LOOKUP] | I[Op.LOOKUP_PIN] | I[Op.TOUCH] | I[Op.INVALIDATE]

        # "two": computed every cycle, registered, issued in the second cycle
        two_rsp = Signal(self.rsp_layout)
        two_conds = [
            (I[Op.LOOKUP_PIN] & lpin_full, Err.PIN_LIMIT),
            (I[Op.INVALIDATE] & m_pinned, Err.PINNED),
            (slot_op & x_slot_bad, Err.BAD_SLOT),
            (I[Op.INVALIDATE_SLOT] & ~x_slot_bad & s_pinned, Err.PINNED),
            ((I[Op.PIN] | I[Op.UNPIN]) & ~x_slot_bad & ~s_held, Err.NOT_VALID),
            (I[Op.PIN] & ~x_slot_bad & s_held & s_full, Err.PIN_LIMIT),
            (I[Op.UNPIN] & ~x_slot_bad & s_held & s_zero, Err.NOT_PINNED),
            (I[Op.ABORT] & ~x_slot_bad & ~s_pend, Err.NOT_PENDING),
        ]
        m.d.comb += [
            two_rsp.hit.eq((lk_like & m_hit) | (I[Op.INVALIDATE_SLOT] & s_hit)),
            two_rsp.pending.eq((lk_like & m_pend) | (I[Op.INVALIDATE_SLOT] & s_pend)),
            two_rsp.slot.eq(field((lk_like, m_slot), (slot_op, x.slot), width=sb_)),
            two_rsp.planes.eq(field((lk_like, m_planes),
                                    (I[Op.INVALIDATE_SLOT], pick(sel_h, planes, pb_)),
                                    (I[Op.ABORT], pick(x_sel, planes, pb_)), width=pb_)),
            two_rsp.evicted.eq((I[Op.INVALIDATE] & m_any) | (I[Op.INVALIDATE_SLOT] & s_held)
                               | I[Op.ABORT]),
            # gated by the registered ``evicted`` in the execute cycle (q below)
            two_rsp.evicted_tag.eq(field((I[Op.INVALIDATE], x.tag),
                                         (I[Op.INVALIDATE_SLOT] | I[Op.ABORT],
                                          pick(x_sel, tags, tb_)), width=tb_)),
            two_rsp.value.eq(field((I[Op.LOOKUP_PIN], m_hot),
                                   (I[Op.PIN], (s_pins + 1)[:self.pin_bits]),
                                   (I[Op.UNPIN], (s_pins - 1)[:self.pin_bits]), width=vb_)),
        ]
        two_rsp_q = Signal(self.rsp_layout)
        # the error conditions are registered one by one and combined in the
        # second cycle (off the first cycle's tag-match -> OR-over-slots path)
        two_cond_q = Signal(len(two_conds), name="two_cond_q")
        m.d.sync += [two_rsp_q.eq(two_rsp), two_cond_q.eq(Cat(c for c, _ in two_conds))]
        two_code_q, two_any_q = Signal(4, name="two_code_q"), Signal(name="two_any_q")
        code_q, any_q = errors([(two_cond_q[k], e) for k, (_, e) in enumerate(two_conds)])
        m.d.comb += [two_code_q.eq(code_q), two_any_q.eq(any_q)]

        # the other classes: from registers and shallow terms, in the cycle they
        # execute. Every field is one flat OR of terms whose conditions carry the
        # registered "no error" of their opcode (LOOKUP and TOUCH cannot fail),
        # so an error needs no zeroing stage after the OR.
        one_code, one_any = errors([
            (I[Op.ALLOCATE] & a_res_q, Err.RESIDENT),
            (I[Op.ALLOCATE] & ~a_res_q & a_pend_q, Err.PENDING),
            (I[Op.ALLOCATE] & ~a_res_q & ~a_pend_q & ~v_cand, Err.NO_VICTIM),
            (I[Op.INVALIDATE_MASK] & k_pinned_q, Err.PINNED),
            (I[Op.STATS] & x_stat_bad, Err.BAD_SLOT),
            (bad_op, Err.BAD_OP),
        ])
        fast_lk = I[Op.LOOKUP] | I[Op.TOUCH]
        g_alloc = I[Op.ALLOCATE] & ~a_res_q & ~a_pend_q & v_cand
        g_mask = I[Op.INVALIDATE_MASK] & ~k_pinned_q
        g_stats = I[Op.STATS] & ~x_stat_bad
        g_two = two & ~two_any_q
        lk_m = [Signal(name=f"lk_m{s}") for s in range(S)]          # fast_lk & held_m
        for s in range(S):
            m.d.comb += lk_m[s].eq(fast_lk & held_m[s])
        q = two_rsp_q
        r = self.x_rsp
        # Stage 1 (the execute cycle): every field except the LOOKUP / TOUCH
        # terms over the slots, which leave as two one-hot vectors (the
        # matching slot, RESIDENT or PENDING) and are picked in stage 2.
        m.d.comb += [
            r.op.eq(x.op),
            r.error.eq(Mux(two, two_code_q, one_code)),
            r.hit.eq(g_two & q.hit),
            r.pending.eq(g_two & q.pending),
            r.slot.eq(field((g_alloc, v_idx), (g_stats, x.slot), (g_two, q.slot), width=sb_)),
            r.planes.eq(Mux(g_two, q.planes, 0)),
            r.evicted.eq((g_alloc & v_evict) | (g_two & q.evicted)),
            r.evicted_tag.eq(field((g_alloc & v_evict, v_tag),
                                   (g_two & q.evicted, q.evicted_tag), width=tb_)),
            r.value.eq(field((g_stats, stat_sel), (g_two, q.value), width=vb_)),
            r.slot_mask.eq(Mux(g_mask, x.slot_mask & Cat(*held), 0)),
        ]
        err_any = Signal(name="x_err_any")
        m.d.comb += [err_any.eq(Mux(two, two_any_q, one_any)), self.x_error.eq(r.error)]

        # Stage 2 (the cycle after): the response stage never holds (its
        # content always moves into the output queue), so the slot registers
        # it reads are exactly the state the command left: ``hot`` is the new
        # hotness of a TOUCH (the old one of a LOOKUP, which writes nothing),
        # ``planes`` unchanged (only ALLOCATE writes it). No adder on the path.
        rv, rb = self.r_valid, self.r_base
        r_lkr, r_lkp = Signal(S), Signal(S)
        m.d.sync += [rv.eq(fire), rb.eq(r),
                     r_lkr.eq(Cat(lk_m[s] & self._hit_state(res[s]) for s in range(S))),
                     r_lkp.eq(Cat(lk_m[s] & ~res[s] for s in range(S)))]
        r_lk = [r_lkr[s] | r_lkp[s] for s in range(S)]
        fin = self.r_rsp
        m.d.comb += [
            fin.eq(rb),
            fin.hit.eq(rb.hit | r_lkr.any()),
            fin.pending.eq(rb.pending | r_lkp.any()),
            fin.slot.eq(rb.slot | pick(r_lk, [Const(s, sb_) for s in range(S)], sb_)),
            fin.planes.eq(rb.planes | pick(r_lk, planes, pb_)),
            fin.value.eq(rb.value | pick(r_lk, hot, self.hot_bits)),
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
        def go(op):
            return fire & x_is[op]
        alloc_go = go(Op.ALLOCATE) & ~a_res_q & ~a_pend_q & v_cand
        mask_go = go(Op.INVALIDATE_MASK) & ~k_pinned_q
        reset_go = go(Op.RESET)
        commit_eff = [Signal(name=f"commit_eff{s}") for s in range(S)]
        freed = [Signal(name=f"freed{s}") for s in range(S)]      # by the command
        for s in range(S):
            free_cmd = freed[s]
            m.d.comb += free_cmd.eq(reset_go
                        | (go(Op.INVALIDATE) & held_m[s] & pins_zero[s])
                        | (go(Op.INVALIDATE_SLOT) & sel_h[s] & pins_zero[s])
                        | (go(Op.ABORT) & x_sel[s] & pend_e[s])
                        | (mask_go & x.slot_mask[s]))
            m.d.comb += alloc[s].eq(alloc_go & v_hot[s])
            # after the command: the cycle's disabled frees, then its commit strobe
            m.d.comb += commit_eff[s].eq(cm[s] & ~dis[s]
                                         & ((held[s] & ~res[s] & ~free_cmd) | alloc[s]))
            with m.If(go(Op.TOUCH) & held_m[s]):
                m.d.sync += hot[s].eq(hot_new[s])
            with m.If(go(Op.DECAY)):
                m.d.sync += hot[s].eq(hot[s] - (hot[s] >> self.decay_shift))
            pin_up = ((go(Op.LOOKUP_PIN) & hit_m[s]) | (go(Op.PIN) & sel_h[s])) & ~pins_full[s]
            pin_down = go(Op.UNPIN) & sel_h[s] & ~pins_zero[s]
            with m.If(pin_up):
                m.d.sync += pins[s].eq(pins[s] + 1)
            with m.If(pin_down):
                m.d.sync += pins[s].eq(pins[s] - 1)
            with m.If(commit_eff[s]):
                m.d.sync += res[s].eq(1)
            with m.If(alloc[s]):
                m.d.sync += [held[s].eq(1), res[s].eq(commit_eff[s]), tags[s].eq(x.tag),
                             planes[s].eq(x.planes), hot[s].eq(x.amount), pins[s].eq(1)]
            with m.If(free_cmd | dis[s]):
                m.d.sync += held[s].eq(0)

        # ---- statistics -------------------------------------------------------------
        lk_c = x_is[Op.LOOKUP] | (x_is[Op.LOOKUP_PIN] & ~two_any_q)
        alloc_c = x_is[Op.ALLOCATE] & ~a_res_q & ~a_pend_q & v_cand
        abort_c = x_is[Op.ABORT] & ~two_any_q
        lk = fire & lk_c
        # slots freed by ``disabled`` for "statistics quiet" only (kv1_any): the
        # ALLOCATE term without ``fire`` - exact whenever a STATS can use it (it
        # then follows a command that executed), and off the ``fire`` path
        alloc_nf = x_valid & alloc_c
        kv_nf = any_of([held[s] & dis[s] for s in range(S)]) | (alloc_nf & any_of(
            [v_hot[s] & dis[s] for s in range(S)]))
        # a slot the command frees in this cycle is not freed again by the
        # cycle's ``disabled`` (step order: command, then disabled)
        kv = Cat(((held[s] & ~freed[s]) | alloc[s]) & dis[s] for s in range(S))
        new = {"lookups": lk, "hits": lk & m_hit, "pending": lk & m_pend,
               "allocations": alloc_go, "evictions": alloc_go & v_evict,
               "commits": any_of(ce_q),
               "aborts": fire & abort_c,
               "kv_frees": _popcount(kv_q)}
        m.d.sync += [ce_q.eq(Cat(commit_eff)), cm2.eq(inc_any_cm)]
        smax = (1 << self.stat_bits) - 1
        with m.If(reset_go):
            m.d.sync += [cnt.eq(0) for cnt in self.counters]
            m.d.sync += [inc[n].eq(0) for n in names] + [inc_any.eq(0), kv_q.eq(0),
                                                         kv1_any.eq(0), kv2_any.eq(0)]
        with m.Else():
            for k, n in enumerate(names):
                cnt = self.counters[k]
                iw = inc[n].shape().width
                total = Signal(max(self.stat_bits, iw) + 1, name=f"stat_sum_{n}")
                m.d.comb += total.eq(cnt + inc[n])
                # saturate on the carry out when the increment is no wider than the counter
                over = total[self.stat_bits] if iw <= self.stat_bits else total > smax
                m.d.sync += [cnt.eq(Mux(over, smax, total[:self.stat_bits])), inc[n].eq(new[n])]
            # a superset of the 1-bit increments loaded now (kept shallow: one
            # AND with ``fire``); it only makes STATS wait
            m.d.sync += [inc_any.eq((fire & (lk_c | alloc_c | abort_c)) | self.commit.valid
                                    | ce_q.any()),
                         kv_q.eq(kv), kv1_any.eq(kv_nf), kv2_any.eq(kv1_any)]
        # ---- x_go for the next cycle ---------------------------------------------
        # "statistics quiet" next cycle; exact whenever the next x_ command is a
        # STATS (it then follows a command that executed or an empty x_, so the
        # terms below need no ``fire``)
        counted_nf = x_valid & (lk_c | alloc_c | abort_c)
        sq_next = Mux(x_valid & x_is[Op.RESET], ~inc_any_cm,
                      ~counted_nf & ~self.commit.valid & ~ce_q.any() & ~kv_nf & ~kv1_any
                      & ~inc_any_cm)
        chg_hold = self.commit.valid | dis_change        # a state change with nothing executing
        go_load = (c.o.valid & ~Cat(cp.op == op for op in two_ops + settle_ops).any()
                   & ~((cp.op == Op.STATS) & ~sq_next))
        go_hold = (x_valid & ~(settle & (chg_hold | (quiet < P - 1))) & ~(two & chg_hold)
                   & ~(x_is[Op.STATS] & ~sq_next))
        m.d.sync += x_go.eq(Mux(load, go_load, go_hold))
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


def _popcount(v):
    """Number of set bits of ``v``, as a balanced adder tree."""
    terms = [v[k] for k in range(len(v))]
    while len(terms) > 1:
        terms = [terms[j] + terms[j + 1] if j + 1 < len(terms) else terms[j]
                 for j in range(0, len(terms), 2)]
    return terms[0]


def _tag_params(cfg) -> dict:
    return gtu.params_from_config(cfg)


def _register():
    from ..blocks import Block
    return [
        Block("tag_unit", "elmoe3d_tag_unit",
              "expert-cache tag unit: {layer, expert} -> slot, FREE/PENDING/RESIDENT, hotness, "
              "pins, KV-disabled slots, 1 lookup/cycle",
              _tag_params, TagUnit, order=30,
              sweep=(dict(tag_slots=8), dict(tag_slots=32, hb_words=16384),
                     dict(tag_slots=128, hb_words=65536))),
    ]


BLOCK_SPECS = _register()
