"""The ``l1bench`` command: the tools people run by hand, one subcommand each.

``l1bench TOOL [ARGS...]`` is ``python -m MODULE [ARGS...]`` of the tool's module
(:func:`module_of`; also ``python -m l1bench TOOL ...`` where the command is not on the PATH):
it calls the module's ``main`` with the rest of the command line. ``l1bench TOOL --help`` lists a tool's arguments.
"""

from __future__ import annotations

import importlib
import sys

#: subcommand (= module of l1bench) -> what it is for (docs/architecture.md)
TOOLS = {
    "extensions": "the table of custom extensions that do not build (extension_failures.md)",
    "failed": "the results that broke (terminal crashed/timeout); --remove: the next run retries them",
    "stalls": "the paper results flagged TIMING_OUTLIER, one path a line",
}

#: Tools whose module is not ``l1bench.TOOL``.
MODULES = {"stalls": "l1bench.timing.stalls"}


def module_of(tool: str) -> str:
    """The module a subcommand runs."""
    return MODULES.get(tool, f"l1bench.{tool}")


def usage(prog: str = "l1bench", tools: dict | None = None) -> str:
    tools = TOOLS if tools is None else tools
    width = max(map(len, tools))
    lines = [f"  {name:<{width}}  {text}" for name, text in tools.items()]
    return f"usage: {prog} TOOL [ARGS...]   ({prog} TOOL --help)\n\ntools:\n" + "\n".join(lines)


def dispatch(prog: str, tools: dict, module_name, argv: list[str] | None = None) -> int:
    """Run ``argv``'s tool (one of ``tools``, its module ``module_name(tool)``) as ``prog TOOL``."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(prog, tools), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    tool, rest = argv[0], argv[1:]
    if tool not in tools:
        print(f"{prog}: unknown tool {tool!r}\n{usage(prog, tools)}", file=sys.stderr)
        return 2
    module = importlib.import_module(module_name(tool))
    # the tool's argparse names itself after argv[0]: "PROG TOOL" in its usage lines
    saved, sys.argv = sys.argv, [f"{prog} {tool}", *rest]
    try:
        return module.main(rest) or 0
    finally:
        sys.argv = saved


def main(argv: list[str] | None = None) -> int:
    return dispatch("l1bench", TOOLS, module_of, argv)


if __name__ == "__main__":
    raise SystemExit(main())
