"""Stream payloads as integers: packing and unpacking by the Amaranth layout.

Amaranth flattens a ``wiring`` stream member ``i`` into ``i__valid``,
``i__ready`` and one ``i__payload`` vector whose bits follow the payload's
``data`` layout (first field in the low bits, array element 0 lowest).
:func:`pack` / :func:`unpack` walk that same layout object, so a testbench or
the native harness can never disagree with the RTL about a bit position.
:class:`Decoder` is :func:`unpack` compiled once per layout, for the many
payloads of a long run.
"""

from __future__ import annotations

from amaranth.hdl import Shape
from amaranth.lib import data
from amaranth.lib import enum as aenum

__all__ = ["pack", "unpack", "Decoder"]


def _shape_of(layout):
    if isinstance(layout, data.Layout):
        return layout
    if isinstance(layout, type) and issubclass(layout, data.View):   # a named data.Struct
        return data.Layout.cast(layout)
    if isinstance(layout, type) and issubclass(layout, aenum.Enum):
        return Shape.cast(layout)
    return Shape.cast(layout)


def pack(layout, value) -> int:
    """Pack a Python value (dicts for structs, lists for arrays, ints) into an
    unsigned integer following an Amaranth layout/shape."""
    layout = _shape_of(layout)
    if isinstance(layout, data.ArrayLayout):
        elem = layout.elem_shape
        width = Shape.cast(elem).width if not isinstance(elem, data.Layout) else elem.size
        if len(value) != layout.length:
            raise ValueError(f"array needs {layout.length} elements, got {len(value)}")
        out = 0
        for i, v in enumerate(value):
            out |= pack(elem, v) << (i * width)
        return out
    if isinstance(layout, data.StructLayout):
        out = 0
        for name, field in layout:
            if name not in value:
                raise KeyError(f"payload field {name!r} missing")
            out |= pack(field.shape, value[name]) << field.offset
        extra = set(value) - {name for name, _ in layout}
        if extra:
            raise KeyError(f"unknown payload fields {sorted(extra)}")
        return out
    width = layout.width
    v = int(value)
    lo = -(1 << (width - 1)) if layout.signed else 0
    hi = (1 << (width - 1)) - 1 if layout.signed else (1 << width) - 1
    if not lo <= v <= hi:
        raise ValueError(f"value {v} does not fit {layout}")
    return v & ((1 << width) - 1)


def unpack(layout, raw: int):
    """Inverse of :func:`pack`."""
    layout = _shape_of(layout)
    if isinstance(layout, data.ArrayLayout):
        elem = layout.elem_shape
        width = Shape.cast(elem).width if not isinstance(elem, data.Layout) else elem.size
        mask = (1 << width) - 1
        return [unpack(elem, (raw >> (i * width)) & mask) for i in range(layout.length)]
    if isinstance(layout, data.StructLayout):
        out = {}
        for name, field in layout:
            w = field.width
            out[name] = unpack(field.shape, (raw >> field.offset) & ((1 << w) - 1))
        return out
    width = layout.width
    raw &= (1 << width) - 1
    if layout.signed and raw >> (width - 1):
        raw -= 1 << width
    return raw


class Decoder:
    """:func:`unpack` for one layout, compiled once into nested closures (a
    shift and a mask per leaf field): ``decoder(raw)`` returns what
    ``unpack(layout, raw)`` returns, several times faster, for the many
    payloads of a long run."""

    def __init__(self, layout):
        self.layout = _shape_of(layout)
        self._fn = _compile(self.layout, 0)

    def __call__(self, raw: int):
        return self._fn(raw)


def _compile(layout, base: int):
    if isinstance(layout, data.ArrayLayout):
        elem = layout.elem_shape
        width = Shape.cast(elem).width if not isinstance(elem, data.Layout) else elem.size
        fns = [_compile(_shape_of(elem), base + i * width) for i in range(layout.length)]
        return lambda raw: [f(raw) for f in fns]
    if isinstance(layout, data.StructLayout):
        items = [(name, _compile(_shape_of(f.shape), base + f.offset)) for name, f in layout]
        return lambda raw: {name: f(raw) for name, f in items}
    w, mask = layout.width, (1 << layout.width) - 1
    if layout.signed:
        top = base + w - 1
        return lambda raw: ((raw >> base) & mask) - (((raw >> top) & 1) << w)
    return lambda raw: (raw >> base) & mask
