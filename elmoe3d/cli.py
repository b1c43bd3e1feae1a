"""The ``elmoe3d`` command line.

Subcommands are modules in :mod:`elmoe3d.commands` (discovered, see its
docstring). User errors -- bad arguments, bad values, missing or unwritable
files, a missing extra -- print one line ``elmoe3d: error: ...`` and exit
with status 2; set ``ELMOE_DEBUG=1`` to get the traceback instead. Ctrl-C
exits with status 130 (:mod:`elmoe3d.interrupt`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys

from . import interrupt
from .extras import MissingExtra, extra_of_module, missing_extra_error

__all__ = ["main", "CLIError", "commands"]


class CLIError(Exception):
    """A user error with a one-line message."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):                # one line, no usage dump
        raise CLIError(f"{self.prog.split()[-1] if ' ' in self.prog else 'arguments'}: {message}")


def commands() -> dict:
    """Command modules by name, in a stable order."""
    from . import commands as pkg
    found = {}
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        mod = importlib.import_module(f"{pkg.__name__}.{info.name}")
        if hasattr(mod, "NAME") and hasattr(mod, "run"):
            found[mod.NAME] = mod
    order = ["build", "verilog", "synth", "quant"]
    return dict(sorted(found.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order
                                                      else len(order), kv[0])))


def make_parser() -> argparse.ArgumentParser:
    from . import __version__
    parser = _Parser(prog="elmoe3d",
                     description="ELMoE-3D reference RTL: Verilog, synthesis estimates, "
                                 "studies and models.")
    parser.add_argument("--version", action="version", version=f"elmoe3d {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, mod in commands().items():
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.register(p)
        p.set_defaults(_run=mod.run)
    return parser


def _error(e: BaseException) -> int:
    if os.environ.get("ELMOE_DEBUG"):
        raise e
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    print(f"elmoe3d: error: {msg}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    with interrupt.handled():
        try:
            args = make_parser().parse_args(argv)
            code = int(args._run(args) or 0)
            interrupt.check()            # a Ctrl-C that arrived where it could not be raised
            return code
        except KeyboardInterrupt:
            print("elmoe3d: interrupted", file=sys.stderr)
            return 130
        except (CLIError, MissingExtra, ValueError, TypeError) as e:
            return _error(e)
        except ModuleNotFoundError as e:
            extra = extra_of_module(e.name)
            if extra is None:                # not an optional dependency: a bug, show it
                raise
            cmd = getattr(locals().get("args"), "command", None)
            return _error(missing_extra_error(f"elmoe3d {cmd}" if cmd else "elmoe3d", extra,
                                              f"module {e.name!r}"))
        except OSError as e:                 # unwritable or missing output/input paths
            return _error(e)


if __name__ == "__main__":
    sys.exit(main())
