"""Generated tables in the docs: the text between two HTML-comment markers
is rewritten from recorded data by the command that owns it (``elmoe3d
tile-run --steady-state --record``, ``elmoe3d moe-bench --record``, the tile
report runs), and a test compares it with the data."""

from __future__ import annotations

from pathlib import Path


def between(text: str, markers: tuple[str, str]) -> str:
    """The text between ``markers`` (stripped); ``ValueError`` naming them if absent."""
    a, b = markers
    if a not in text or b not in text:
        raise ValueError(f"no generated section {a!r} ... {b!r}")
    return text[text.index(a) + len(a):text.index(b)].strip()


def replace_between(path, markers: tuple[str, str], body: str) -> bool:
    """Rewrite the text between ``markers`` in ``path`` with ``body``;
    ``True`` if the file changed. ``ValueError`` naming the file and the
    markers if it has none."""
    p = Path(path)
    text = p.read_text()
    a, b = markers
    if a not in text or b not in text:
        raise ValueError(f"{p} has no generated section {a!r} ... {b!r}")
    i, j = text.index(a) + len(a), text.index(b)
    new = text[:i] + "\n" + body + "\n" + text[j:]
    if new != text:
        p.write_text(new)
    return new != text
