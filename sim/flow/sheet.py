"""Interface sheets: what a generated Verilog file is, in its own header.

``elmoe3d verilog`` writes every block's Verilog with a header comment (and a
JSON file of the same content beside it, ``<top>.json``) that names

* the configuration: every :class:`~elmoe3d.config.Config` field, the preset
  it came from and a hash of all of them (:func:`config_hash`), and the
  block's own elaboration parameters;
* the clock and reset convention (one clock ``clk``, synchronous active-high
  ``rst``; streams transfer on a rising edge with ``valid`` and ``ready``);
* every port: Verilog name, direction, width, and for a port whose shape is a
  ``data.Layout`` (every stream payload) its bit map -- each leaf field with
  its bit offset and width, nested structs and arrays flattened into dotted
  names (``sv.slices[3]``), enums with their values -- read from the Amaranth
  layouts of :mod:`elmoe3d.hw.vocab`, never written by hand.

The header is comment lines only, so Verilator, Yosys and Icarus read the
file as before. Synthesis and simulation caches are keyed on the logic
(:func:`logic_text` strips the sheet), so a sheet never causes a rebuild.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from amaranth.hdl import Shape, ShapeCastable, Value
from amaranth.lib import data
from amaranth.lib import enum as aenum
from amaranth.lib.wiring import In

__all__ = ["Field", "Port", "config_hash", "layout_fields", "port_map", "sheet", "header",
           "logic_text", "SHEET_BEGIN", "SHEET_END", "suffix_for", "CLOCK_RESET"]

SHEET_BEGIN = "// ==== elmoe3d interface sheet"
SHEET_END = "// ==== end of interface sheet"

#: The clock and reset convention of every generated top.
CLOCK_RESET = (
    "one clock, `clk`: every register changes on its rising edge. `rst` is synchronous and "
    "active high: registers take their reset values at a rising edge of `clk` with `rst` = 1; "
    "assert it for at least one edge after power-up (on an FPGA the bitstream also loads the "
    "reset values as initial values). Streams (valid/ready/payload, "
    "amaranth.lib.stream): a beat transfers at a rising edge with `valid` and `ready` both 1; "
    "a producer keeps `valid` and `payload` until the transfer and never waits for `ready` "
    "before raising `valid`.")


@dataclass(frozen=True)
class Field:
    """One leaf of a payload: dotted name, bit offset (LSB 0), width, and its
    kind: ``unsigned``, ``signed`` or an enum (``enum`` names it, ``values``
    maps member names to codes)."""
    name: str
    offset: int
    width: int
    signed: bool = False
    enum: str | None = None
    values: dict | None = None

    def to_dict(self) -> dict:
        d = {"name": self.name, "offset": self.offset, "width": self.width,
             "signed": self.signed}
        if self.enum:
            d.update(enum=self.enum, values=self.values)
        return d


@dataclass(frozen=True)
class Port:
    """One top-level Verilog port; ``fields`` is its bit map (empty for a
    plain vector), ``type`` the name of its payload class, if any."""
    name: str
    direction: str
    width: int
    type: str | None
    fields: tuple

    def to_dict(self) -> dict:
        return {"name": self.name, "direction": self.direction, "width": self.width,
                "type": self.type, "fields": [f.to_dict() for f in self.fields]}


def config_hash(cfg) -> str:
    """SHA-256 (hex) of the JSON of every Config field, sorted by name."""
    return hashlib.sha256(json.dumps(cfg.to_dict(), sort_keys=True).encode()).hexdigest()


def suffix_for(cfg) -> str:
    """The per-configuration name suffix (``--suffix config``): ``_c`` and
    the first 8 hex digits of :func:`config_hash`."""
    return "_c" + config_hash(cfg)[:8]


def _leaf(name, shape, offset) -> Field:
    if isinstance(shape, type) and issubclass(shape, aenum.Enum) or \
            isinstance(shape, aenum.EnumMeta):
        sh = Shape.cast(shape)
        return Field(name, offset, sh.width, sh.signed, shape.__name__,
                     {m.name: int(m.value) for m in shape})
    sh = Shape.cast(shape)
    return Field(name, offset, sh.width, sh.signed)


def layout_fields(layout, prefix: str = "", offset: int = 0) -> list[Field]:
    """Every leaf of a ``data.Layout`` (or a ``data.Struct`` class), in bit
    order within each level: struct members as ``prefix.name``, array
    elements as ``prefix[i]``, union members all at the union's offset."""
    lay = data.Layout.cast(layout)
    out = []
    if isinstance(lay, data.ArrayLayout):
        for i in range(lay.length):
            name = f"{prefix}[{i}]"
            out += _fields_of(name, lay.elem_shape, offset + i * Shape.cast(lay.elem_shape).width)
        return out
    for name, f in lay:
        full = f"{prefix}.{name}" if prefix else str(name)
        out += _fields_of(full, f.shape, offset + f.offset)
    return out


def _fields_of(name, shape, offset) -> list[Field]:
    if isinstance(shape, data.Layout) or (isinstance(shape, type) and
                                          issubclass(shape, (data.Struct, data.Union))):
        return layout_fields(shape, name, offset)
    if isinstance(shape, ShapeCastable) and not isinstance(shape, aenum.EnumMeta):
        try:
            return layout_fields(data.Layout.cast(shape), name, offset)
        except TypeError:
            pass
    return [_leaf(name, shape, offset)]


def _type_name(shape) -> str | None:
    if isinstance(shape, type):
        return shape.__name__
    if isinstance(shape, data.Layout):
        return type(shape).__name__
    return None


def port_map(component) -> list[Port]:
    """The component's top-level ports as Amaranth's Verilog names them
    (the signature path joined with ``__``) with their bit maps."""
    ports = []
    for path, member, value in component.signature.flatten(component):
        name = "__".join(str(p) for p in path)
        width = len(Value.cast(value))
        shape = member.shape
        fields = ()
        if isinstance(shape, data.Layout) or (isinstance(shape, type) and
                                              issubclass(shape, (data.Struct, data.Union))):
            fields = tuple(layout_fields(shape))
        elif isinstance(shape, aenum.EnumMeta):
            fields = (_leaf("", shape, 0),)
        ports.append(Port(name, "input" if member.flow == In else "output", width,
                          _type_name(shape), fields))
    return ports


def sheet(block, component, cfg, *, top: str, preset: str | None = None,
          suffix: str = "") -> dict:
    """The interface sheet as a JSON-able dict (what ``<top>.json`` holds)."""
    return {
        "format": "elmoe3d-interface-sheet", "version": 1,
        "block": block.name, "top": top, "suffix": suffix,
        "description": block.description,
        "preset": preset, "config_sha256": config_hash(cfg), "config": cfg.to_dict(),
        "params": block.params(cfg),
        "clock": "clk", "reset": {"name": "rst", "synchronous": True, "active": "high"},
        "clock_reset": CLOCK_RESET,
        "ports": [p.to_dict() for p in port_map(component)],
    }


def _wrap(text: str, width: int = 96, indent: str = "//   ") -> list[str]:
    words, lines, cur = text.split(), [], ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > width - len(indent):
            lines.append(indent + cur)
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    if cur:
        lines.append(indent + cur)
    return lines


def _bit_range(offset: int, width: int) -> str:
    return f"[{offset + width - 1}:{offset}]" if width > 1 else f"[{offset}]"


def _kind(f: dict) -> str:
    if f.get("enum"):
        return f"{f['enum']}: " + ", ".join(f"{k}={v}" for k, v in f["values"].items())
    return "signed" if f["signed"] else "unsigned"


_ELEM = re.compile(r"^(.*)\[(\d+)\]$")


def _rows(fields: list[dict]) -> list[str]:
    """Header rows of a bit map; a run of more than four array elements of
    one scalar kind is one row (``x[0..127]``, element ``i`` at ``offset + i*width``)."""
    rows, i = [], 0
    while i < len(fields):
        f = fields[i]
        m = _ELEM.match(f["name"])
        j = i + 1
        if m and m.group(2) == "0":
            base = m.group(1)
            while (j < len(fields) and fields[j]["name"] == f"{base}[{j - i}]"
                   and fields[j]["width"] == f["width"] and _kind(fields[j]) == _kind(f)
                   and fields[j]["offset"] == f["offset"] + (j - i) * f["width"]):
                j += 1
        n = j - i
        if n > 4:
            rows.append(f"//     {_bit_range(f['offset'], n * f['width']):>12s}  {base}[0..{n - 1}]  "
                        f"{n} x {f['width']} bits, {base}[i] at {_bit_range(f['offset'], f['width'])}"
                        f" + {f['width']}*i; {_kind(f)}")
            i = j
        else:
            rows.append(f"//     {_bit_range(f['offset'], f['width']):>12s}  "
                        f"{f['name'] or '(value)'}  {_kind(f)}")
            i += 1
    return rows


def header(sh: dict) -> str:
    """The Verilog comment block of a sheet (every line starts with ``//``)."""
    cfg = sh["config"]
    out = [f"{SHEET_BEGIN}: {sh['top']} (block {sh['block']}) " + "=" * 8,
           "// Generated by `elmoe3d verilog` from the Amaranth sources; the same content, as JSON,",
           f"// is in {sh['top']}.json beside this file.",
           *_wrap(sh["description"], indent="// "),
           "//",
           f"// Configuration: preset {sh['preset'] or '(custom)'}, config sha256 "
           f"{sh['config_sha256'][:16]} (of the JSON of every Config field, sorted)",
           *_wrap(" ".join(f"{k}={v}" for k, v in cfg.items())),
           "// Block parameters:",
           *_wrap(" ".join(f"{k}={v}" for k, v in sh["params"].items())),
           "//",
           "// Clock and reset:",
           *_wrap(sh["clock_reset"]),
           "//",
           "// Ports: direction, Verilog range, name, payload type; then each payload's bit map,",
           "// field bit ranges within the port (LSB = bit 0), nested fields as dotted names.",
           ]
    out += [f"//   {'input':6s} {'':>10s} {sh['clock']}  (clock)",
            f"//   {'input':6s} {'':>10s} {sh['reset']['name']}  (reset: synchronous, active high)"]
    for p in sh["ports"]:
        rng = f"[{p['width'] - 1}:0]" if p["width"] > 1 else ""
        out.append(f"//   {p['direction']:6s} {rng:>10s} {p['name']}"
                   + (f"  ({p['type']})" if p["type"] else ""))
        if p["fields"]:
            out += _rows(p["fields"])
    out.append(SHEET_END + " " + "=" * 60)
    return "\n".join(out) + "\n"


def logic_text(text: str) -> str:
    """The Verilog without its interface sheet (what caches are keyed on)."""
    if not text.startswith(SHEET_BEGIN):
        return text
    end = text.find(SHEET_END)
    if end < 0:
        return text
    nl = text.find("\n", end)
    return text[nl + 1:] if nl >= 0 else ""
