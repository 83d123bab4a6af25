"""MkDocs hook: the reference pages, generated from the code at every build so they cannot drift.

Each page is made in memory (``File.generated``), never written into ``docs/``: the CLI from
the Typer app, the gRPC API from the proto descriptors and ``chronoq.limits``, configuration
from ``NodeSettings`` and the CLI's environment variables, metrics from the metric objects in
the source and the alert rules file, error codes from ``chronoq.errors``.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import io
import pathlib
import tokenize
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import typer
import yaml  # type: ignore[import-untyped]
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_MODULES = ("tasks", "worker", "schedules", "cluster")
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"

# Request fields whose bound is a constant of chronoq.limits, by field name (any message).
# A name missing from chronoq.limits fails the build.
FIELD_LIMITS = {
    "queue": "MAX_NAME",
    "queues": "MAX_QUEUES_PER_CLAIM",
    "namespace": "MAX_NAME",
    "name": "MAX_NAME",
    "idempotency_key": "MAX_IDEMPOTENCY_KEY",
    "worker_id": "MAX_WORKER_ID",
    "id": "MAX_TASK_ID",
    "task_id": "MAX_TASK_ID",
    "ids": "MAX_REQUEUE_IDS",
    "page_token": "MAX_PAGE_TOKEN",
    "page_size": "MAX_PAGE_SIZE",
    "error": "MAX_ERROR_MESSAGE",
    "cron": "MAX_CRON",
    "timezone": "MAX_TIMEZONE",
    "content_type": "MAX_CONTENT_TYPE",
    "concurrency_key": "MAX_CONTROL_KEY",
    "unique_key": "MAX_CONTROL_KEY",
    "debounce_key": "MAX_CONTROL_KEY",
    "labels": "MAX_LABELS",
    "unique_for": "MAX_UNIQUE_FOR",
    "debounce": "MAX_DEBOUNCE",
    "debounce_max": "MAX_DEBOUNCE_MAX",
    "lease_token": "MAX_LEASE_TOKEN",
    "max_tasks": "MAX_CLAIM_TASKS",
    "leases": "MAX_LEASES_PER_CALL",
    "credits": "MAX_STREAM_CREDITS",
    "buckets": "MAX_STATUS_BUCKETS",
    "rate": "MAX_QUEUE_RATE",
    "burst": "MAX_QUEUE_BURST",
}


def cell(text: object) -> str:
    """One Markdown table cell: no newline, no bare pipe."""
    return " ".join(str(text).split()).replace("|", "\\|")


def shown(value: object) -> str:
    if isinstance(value, timedelta):
        return f"{value.total_seconds():g} s"
    if isinstance(value, float) and value.is_integer():
        return f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return repr(value)


# --- CLI --------------------------------------------------------------------------------------


def cli_page() -> str:
    from chronoq.cli import app

    root = typer.main.get_command(app)
    lines = [
        "# CLI reference",
        "",
        "Generated from the `chronoq` Typer app at build time: every command, every option, its",
        "environment variable and its default. `chronoq COMMAND --help` prints the same.",
        "",
    ]
    for path, command in walk(root, ["chronoq"]):
        lines += [f"## `{' '.join(path)}`", ""]
        doc = (command.help or "").strip()
        if doc:
            lines += [doc.split("\n\n")[0], ""]
        params = [p for p in command.params if p.name != "help"]
        if isinstance(getattr(command, "commands", None), dict):
            subs = ", ".join(f"`{name}`" for name in sorted(command.commands))
            lines += [f"Commands: {subs}.", ""]
        if params:
            lines += ["| option | environment | default | what |", "| --- | --- | --- | --- |"]
            for p in params:
                lines.append(param_row(p))
            lines.append("")
    return "\n".join(lines)


def walk(command: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
    """Every command under ``command`` (Typer's click may be its own copy: duck-typed)."""
    yield path, command
    subcommands = getattr(command, "commands", None)
    if isinstance(subcommands, dict):
        for name in sorted(subcommands):
            yield from walk(subcommands[name], [*path, name])


def param_row(p: Any) -> str:
    if p.param_type_name == "option":
        names = ", ".join(f"`{o}`" for o in [*p.opts, *p.secondary_opts])
        what = p.help or ""
    else:
        names = f"`{(p.name or '').upper()}` (argument)"
        what = getattr(p, "help", "") or ""
    env = p.envvar if isinstance(p.envvar, str) else ", ".join(p.envvar or ())
    default = "" if p.default in (None, (), []) or callable(p.default) else f"`{p.default}`"
    if p.required:
        default = "required"
    return f"| {names} | {f'`{env}`' if env else ''} | {cell(default)} | {cell(what)} |"


# --- gRPC -------------------------------------------------------------------------------------


def grpc_page() -> str:
    from chronoq import limits

    lines = [
        "# gRPC API reference",
        "",
        "Generated from the compiled proto descriptors (`chronoq/api/v1/*_pb2.py`) and",
        "`chronoq/limits.py` at build time. Package `chronoq.v1`. The bound column gives the",
        "`chronoq.limits` constant that the node checks for a field of that name; the node's",
        "own settings (`Limits`) may be lower. What each call does and the status codes:",
        "[calls, codes and limits](grpc-guide.md).",
        "",
    ]
    for module_name in PROTO_MODULES:
        module = importlib.import_module(f"chronoq.api.v1.{module_name}_pb2")
        fd = module.DESCRIPTOR
        lines += [f"## `{fd.name}`", ""]
        for service in fd.services_by_name.values():
            lines += [f"### service `{service.full_name}`", "", "| method | request | answer |"]
            lines.append("| --- | --- | --- |")
            for m in service.methods:
                down = "stream " if m.server_streaming else ""
                up = "stream " if m.client_streaming else ""
                lines.append(
                    f"| `{m.name}` | {up}`{m.input_type.name}` | {down}`{m.output_type.name}` |"
                )
            lines.append("")
        for enum in fd.enum_types_by_name.values():
            lines += enum_table(enum)
        for message in fd.message_types_by_name.values():
            lines += message_table(message, limits)
    lines += ["## Bounds in `chronoq.limits`", ""]
    lines += constants_table(limits)
    return "\n".join(lines)


def message_table(message: Descriptor, limits: Any) -> list[str]:
    lines = [f"### message `{message.full_name}`", ""]
    if message.fields:
        lines += ["| field | number | type | bound |", "| --- | --- | --- | --- |"]
        for f in message.fields:
            bound = ""
            if f.name in FIELD_LIMITS:
                constant = FIELD_LIMITS[f.name]
                bound = f"`{constant}` = {shown(getattr(limits, constant))}"
            lines.append(f"| `{f.name}` | {f.number} | {field_type(f)} | {bound} |")
    else:
        lines.append("No fields.")
    lines.append("")
    for nested in message.enum_types:
        lines += enum_table(nested)
    for sub in message.nested_types:
        if not sub.GetOptions().map_entry:
            lines += message_table(sub, limits)
    return lines


def field_type(f: FieldDescriptor) -> str:
    if f.message_type is not None:
        name = f.message_type.full_name
        if f.message_type.GetOptions().map_entry:
            k, v = f.message_type.fields
            return f"map<{field_type(k)}, {field_type(v)}>"
    elif f.enum_type is not None:
        name = f.enum_type.full_name
    else:
        name = {
            v: k.removeprefix("TYPE_").lower()
            for k, v in vars(FieldDescriptor).items()
            if k.startswith("TYPE_")
        }[f.type]
    repeated = f.is_repeated and not (
        f.message_type is not None and f.message_type.GetOptions().map_entry
    )
    oneof = f" (oneof `{f.containing_oneof.name}`)" if f.containing_oneof else ""
    return f"{'repeated ' if repeated else ''}`{name}`{oneof}"


def enum_table(enum: EnumDescriptor) -> list[str]:
    values = ", ".join(f"`{v.name}` = {v.number}" for v in enum.values)
    return [f"### enum `{enum.full_name}`", "", values, ""]


def constants_table(module: Any) -> list[str]:
    comments = source_comments(inspect.getsource(module))
    lines = ["| constant | value | why |", "| --- | --- | --- |"]
    for name, value in vars(module).items():
        public = name.isupper() and not name.startswith("_")
        if public and isinstance(value, int | float | timedelta):
            lines.append(f"| `{name}` | {shown(value)} | {cell(comments.get(name, ''))} |")
    return [*lines, ""]


def source_comments(source: str) -> dict[str, str]:
    """Comments above or beside each top-level or class-level name in ``source``."""
    by_line: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            by_line[tok.start[0]] = tok.string.lstrip("#").strip()
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(source)):
        target: ast.expr | None = None
        if not isinstance(node, ast.stmt):
            continue
        if isinstance(node, ast.AnnAssign):
            target = node.target
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if not isinstance(target, ast.Name):
            continue
        above: list[str] = []
        line = node.lineno - 1
        while line in by_line:
            above.insert(0, by_line[line])
            line -= 1
        beside = by_line.get(node.lineno, "")
        found.setdefault(target.id, " ".join([*above, beside]).strip())
    return found


# --- configuration ----------------------------------------------------------------------------


def config_page() -> str:
    from chronoq import config, limits

    lines = [
        "# Configuration reference",
        "",
        "Generated at build time. A node is configured by one keyword-only object,",
        "`chronoq.config.NodeSettings`; the command line fills it from flags, `CHRONOQ_*`",
        "variables and a TOML file (see [layers and files](configuration-guide.md)).",
        "",
    ]
    for cls in (config.NodeSettings, limits.Limits, *cluster_classes(config)):
        lines += [f"## `{cls.__module__}.{cls.__qualname__}`", ""]
        doc = (cls.__doc__ or "").strip().split("\n\n")[0]
        lines += [" ".join(doc.split()), ""]
        comments = source_comments(inspect.getsource(cls))
        lines += ["| key | default | why |", "| --- | --- | --- |"]
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                default = shown(f.default)
            elif f.default_factory is not dataclasses.MISSING:
                default = "computed"
            else:
                default = "required"
            lines.append(f"| `{f.name}` | {cell(default)} | {cell(comments.get(f.name, ''))} |")
        lines.append("")
    lines += [
        "## Environment variables",
        "",
        "Every option of every command, by variable (from the Typer app).",
        "",
        "| variable | option | commands |",
        "| --- | --- | --- |",
    ]
    from chronoq.cli import app

    env: dict[str, tuple[set[str], set[str]]] = {}
    for path, command in walk(typer.main.get_command(app), ["chronoq"]):
        for p in command.params:
            names = [p.envvar] if isinstance(p.envvar, str) else list(p.envvar or ())
            for name in names:
                opts, commands = env.setdefault(name, (set(), set()))
                opts.update(getattr(p, "opts", []))
                commands.add(" ".join(path[1:]) or "(global)")
    for name in sorted(env):
        opts, commands = env[name]
        lines.append(
            f"| `{name}` | {', '.join(f'`{o}`' for o in sorted(opts))} | "
            f"{cell(', '.join(sorted(commands)))} |"
        )
    return "\n".join([*lines, ""])


def cluster_classes(config: Any) -> list[type]:
    return [
        c
        for c in vars(config).values()
        if inspect.isclass(c)
        and dataclasses.is_dataclass(c)
        and c.__module__ == config.__name__
        and c is not config.NodeSettings
    ]


# --- metrics and alerts -----------------------------------------------------------------------

METRIC_CALLS = {
    "Counter": "counter",
    "Gauge": "gauge",
    "Histogram": "histogram",
    "Summary": "summary",
    "CounterMetricFamily": "counter",
    "GaugeMetricFamily": "gauge",
    "HistogramMetricFamily": "histogram",
}


def metrics_page() -> str:
    rows: dict[str, tuple[str, str, str, str]] = {}
    for path in sorted((ROOT / "chronoq").rglob("*.py")):
        for name, kind, doc, labels in metric_calls(path.read_text()):
            exported = f"{name}_total" if kind == "counter" else name
            where = str(path.relative_to(ROOT))
            rows.setdefault(exported, (kind, labels, doc, where))
    lines = [
        "# Metrics and alert rules",
        "",
        "Generated at build time from every metric the source defines (`prometheus_client`",
        "objects and scrape-time collectors) and from `deploy/prometheus/alerts.yml`. A node",
        "serves them with `chronoq node --metrics-port 9464`; see",
        "[monitoring and alerts](../how-to/monitoring.md).",
        "",
        "## Metrics",
        "",
        "| metric | type | labels | what | defined in |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name in sorted(rows):
        kind, labels, doc, where = rows[name]
        lines.append(f"| `{name}` | {kind} | {labels} | {cell(doc)} | `{where}` |")
    lines += ["", "## Alert rules", ""]
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        lines += [
            f"### group `{group['name']}`",
            "",
            "| alert | for | severity | expression | summary |",
            "| --- | --- | --- | --- | --- |",
        ]
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            lines.append(
                f"| `{rule['alert']}` | {rule.get('for', '')} | "
                f"{rule.get('labels', {}).get('severity', '')} | `{cell(rule['expr'])}` | "
                f"{cell(rule.get('annotations', {}).get('description', ''))} |"
            )
        lines.append("")
    return "\n".join(lines)


def metric_calls(source: str) -> Iterator[tuple[str, str, str, str]]:
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        fname = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if fname not in METRIC_CALLS or len(node.args) < 2:
            continue
        name, doc = node.args[0], node.args[1]
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
            continue
        if not name.value.startswith("chronoq_"):
            continue
        text = doc.value if isinstance(doc, ast.Constant) else ""
        labels = ""
        for kw in node.keywords:
            if kw.arg in ("labels", "labelnames") and isinstance(kw.value, ast.List | ast.Tuple):
                labels = ", ".join(
                    f"`{e.value!s}`" for e in kw.value.elts if isinstance(e, ast.Constant)
                )
        if len(node.args) > 2 and isinstance(node.args[2], ast.List | ast.Tuple):
            labels = ", ".join(
                f"`{e.value!s}`" for e in node.args[2].elts if isinstance(e, ast.Constant)
            )
        yield name.value, METRIC_CALLS[fname], str(text), labels


# --- errors -----------------------------------------------------------------------------------


def errors_page() -> str:
    from chronoq import errors

    classes = [
        c
        for c in vars(errors).values()
        if inspect.isclass(c)
        and issubclass(c, errors.ChronoqError)
        and c.__module__ == errors.__name__
    ]
    remote = [c for c in classes if issubclass(c, errors.RemoteError)]
    lines = [
        "# Error codes",
        "",
        "Generated from `chronoq.errors` at build time. A node raises a `ChronoqError` subclass",
        "and its edge answers the class's gRPC code with the error's message; a client raises",
        "the `RemoteError` subclass that lists the code it received.",
        "",
        "## Raised by the node and the library",
        "",
        "| class | base | gRPC code | why |",
        "| --- | --- | --- | --- |",
    ]
    for c in classes:
        if c in remote:
            continue
        base = c.__mro__[1].__name__
        lines.append(f"| `{c.__name__}` | `{base}` | `{c.grpc_code}` | {cell(first(c.__doc__))} |")
    lines += [
        "",
        "## Raised by the client",
        "",
        "| class | gRPC codes received | why |",
        "| --- | --- | --- |",
    ]
    for c in remote:
        codes = ", ".join(f"`{code}`" for code in getattr(c, "grpc_codes", ()))
        lines.append(f"| `{c.__name__}` | {codes} | {cell(first(c.__doc__))} |")
    return "\n".join([*lines, ""])


def first(doc: str | None) -> str:
    return (doc or "").strip().split("\n\n")[0]


# --- the hook ---------------------------------------------------------------------------------

GENERATED: dict[str, Callable[[], str]] = {
    "reference/cli.md": cli_page,
    "reference/grpc.md": grpc_page,
    "reference/configuration.md": config_page,
    "reference/metrics.md": metrics_page,
    "reference/errors.md": errors_page,
}


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for uri, make in GENERATED.items():
        files.append(File.generated(config, uri, content=make()))
    return files
