"""Property helpers shared by the formal wrappers.

:func:`stream_rules` states the ``amaranth.lib.stream`` transfer rules on one
stream: once ``valid`` is high without ``ready``, ``valid`` stays high and the
payload stays unchanged until the transfer. On a stream the block *drives*
(an output) this is an ``Assert``; on a stream the environment drives (an
input) it is an ``Assume``, so the block is proved against every legal
producer and no illegal one. :func:`history_ok` is a flag that is 0 in the
first cycle (no history yet).
"""

from __future__ import annotations

from amaranth.hdl import Assert, Assume, Signal

__all__ = ["history_ok", "stream_rules", "stream_rules_all"]


def history_ok(m) -> Signal:
    """A signal that is 0 in the first cycle and 1 afterwards (one per module)."""
    ok = getattr(m, "_elmoe_history_ok", None)
    if ok is None:
        ok = Signal(name="history_ok")
        m.d.sync += ok.eq(1)
        m._elmoe_history_ok = ok
    return ok


def stream_rules(m, s, name: str, *, drive: str) -> None:
    """Assert (``drive="dut"``) or assume (``drive="env"``) the stream rules on
    ``s`` (an ``amaranth.lib.stream.Interface``)."""
    if drive not in ("dut", "env"):
        raise ValueError(f"drive must be 'dut' or 'env', not {drive!r}")
    ok = history_ok(m)
    p_valid = Signal(name=f"{name}_p_valid")
    p_ready = Signal(name=f"{name}_p_ready")
    payload = s.payload.as_value() if hasattr(s.payload, "as_value") else s.payload
    p_payload = Signal.like(payload, name=f"{name}_p_payload")
    m.d.sync += [p_valid.eq(s.valid), p_ready.eq(s.ready), p_payload.eq(payload)]
    held = s.valid & (payload == p_payload)
    with m.If(ok & p_valid & ~p_ready):
        if drive == "dut":
            m.d.comb += Assert(held, f"stream {name}: valid dropped or payload changed before ready")
        else:
            m.d.comb += Assume(held)


def stream_rules_all(m, component, *, prefix: str = "", nested: bool = False) -> list[str]:
    """Stream rules on every stream port of a ``wiring.Component`` (arrays
    included): asserted on its outputs, assumed on its inputs. With
    ``nested``, also on the streams inside its other interfaces (a
    request/response port: ``<port>_<stream>``). Returns
    the names of the streams it covered."""
    names = []
    _rules(m, component.signature, component, prefix, nested, names)
    return names


def _rules(m, sig, obj, prefix, nested, names):
    # a member's signature is already seen from the component (an ``In``
    # member's is flipped), so its flows need no composing here
    from amaranth.lib import stream, wiring
    for name, member in sig.members.items():
        if member.is_port:
            continue
        here = getattr(obj, name)
        objs = [here] if not member.dimensions else [here[i] for i in range(member.dimensions[0])]
        out = member.flow == wiring.Out
        for i, s in enumerate(objs):
            n = f"{prefix}{name}" + (f"{i}" if member.dimensions else "")
            if isinstance(member.signature, stream.Signature):
                stream_rules(m, s, n, drive="dut" if out else "env")
                names.append(n)
            elif nested:
                _rules(m, member.signature, s, f"{n}_", nested, names)
