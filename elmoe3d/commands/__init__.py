"""``elmoe3d`` subcommands, one module each, discovered by :mod:`elmoe3d.cli`.

A command module defines ``NAME`` (the subcommand), ``HELP`` (one line),
``register(parser)`` (adds its arguments to an ``argparse`` parser) and
``run(args) -> int``. It may also define ``build_section(ctx)`` returning a
:class:`elmoe3d.report.Section`, which ``elmoe3d build`` (and so ``make demo``)
adds to the report. Adding a command never means editing the CLI.
"""
