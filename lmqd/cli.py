"""The ``lmqd`` command: nsqd's flags, its config file, then ``run_daemon``.

Every flag of nsqd v1.3.0 (and master) is accepted with nsqd's name, default and value syntax
(``lmqd.config.SETTINGS`` is the table), plus lmq's ``--durable``. Command lines written for nsqd
-- including test harnesses' -- therefore work unchanged.

Flag syntax. nsqd parses with Go's ``flag`` package, which accepts ``-flag value``,
``-flag=value``, ``--flag value`` and ``--flag=value``, and takes bool flags bare (``-snappy``) or
with ``=`` (``-snappy=false``; ``-snappy false`` is *not* a bool assignment). click understands
only the ``--flag`` forms, so ``normalise_argv`` rewrites the command line first, by this rule:

- a token ``-name``, ``--name``, ``-name=value`` or ``--name=value`` whose ``name`` is a known
  flag becomes ``--name=value``; for a non-bool flag without ``=``, the next token is its value
  (whatever it looks like, as in Go: ``--log-prefix -x`` sets the prefix to ``-x``);
- a bare bool flag becomes ``--name=true``;
- ``-h``, ``-help`` and ``-version`` become click's ``--help`` / ``--version``;
- any other token starting with ``-`` is an unknown flag (an error naming it);
- everything after ``--`` is left alone (and then rejected: lmqd takes no arguments).

Errors in values (a bad duration, a bad integer, a failed Options check) print one line,
``Error: <message>``, on stderr and exit with status 1; unknown flags are usage errors (status 2),
as click reports them.
"""

from __future__ import annotations

import difflib
import logging
import re
import sys
from collections.abc import Sequence
from typing import Any

import click

from lmqd import BUILT_WITH, NSQD_COMPAT_VERSION, logging_setup
from lmqd import config as lmq_config
from lmqd.config import BOOL_KINDS, BOOL_WORDS, SETTINGS, ConfigError, Kind, Setting
from lmqd.options import Options

__all__ = ["VERSION_LINE", "main", "normalise_argv"]

log = logging.getLogger("lmqd.cli")

VERSION_LINE = f"nsqd v{NSQD_COMPAT_VERSION} (built w/{BUILT_WITH})"
"""What ``lmqd --version`` prints, and the first line lmqd logs: nsqd's shape
(``nsqd v1.3.0 (built w/go1.19.8)``), because test harnesses parse it to learn which nsqd
features exist (TLS, HTTPS listener, ...); lmq's own version is the toolchain token
(``lmqd.BUILT_WITH``, as lmqlookupd's ``nsqlookupd v1.3.0 (built w/lmq-0.1.0)``)."""

_SETTING_FLAGS = frozenset(s.flag for s in SETTINGS)
_BOOL_FLAGS = frozenset(s.flag for s in SETTINGS if s.kind in BOOL_KINDS)
_VALUE_FLAGS = _SETTING_FLAGS - _BOOL_FLAGS | {"config"}
# Flags that are click's own switches here (no value); Go spells help -h or -help.
_SWITCHES = {"version": "--version", "help": "--help", "h": "--help"}
_FLAG_TOKEN = re.compile(r"--?([A-Za-z0-9][A-Za-z0-9_.-]*)(?:=(.*))?", re.DOTALL)


def normalise_argv(args: Sequence[str], ctx: click.Context | None = None) -> list[str]:
    """Rewrite nsqd-style arguments into the ``--name=value`` form click parses (rule above).

    Raises ``click.NoSuchOption`` for an unknown flag and ``click.UsageError`` for a flag missing
    its value or a bool flag followed by a separate ``true``/``false``.
    """
    out: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if token == "--":
            out.extend(args[i - 1 :])
            break
        match = _FLAG_TOKEN.fullmatch(token)
        if match is None:
            out.append(token)  # a positional argument, or "-": click rejects it
            continue
        name, value = match.group(1), match.group(2)
        if name in _SWITCHES:
            # Go's -version is a bool flag: -version=false is a way of not asking.
            if value is None or _parse_switch(token, value, ctx):
                out.append(_SWITCHES[name])
        elif name in _BOOL_FLAGS:
            if value is None:
                if i < len(args) and args[i] in BOOL_WORDS:
                    raise click.UsageError(
                        f"bool flag {token} takes its value after '=': use --{name}={args[i]}", ctx
                    )
                value = "true"
            out.append(f"--{name}={value}")
        elif name in _VALUE_FLAGS:
            if value is None:
                if i == len(args):
                    raise click.UsageError(f"flag needs an argument: {token}", ctx)
                value = args[i]
                i += 1
            out.append(f"--{name}={value}")
        else:
            flag = token.partition("=")[0]
            known = sorted(_SETTING_FLAGS | {"config", "version", "help"})
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.8)
            raise click.NoSuchOption(flag, possibilities=[f"--{c}" for c in close], ctx=ctx)
    return out


def _parse_switch(token: str, value: str, ctx: click.Context | None) -> bool:
    try:
        return lmq_config.parse_bool(value)
    except ValueError as exc:
        raise click.UsageError(f"invalid value for {token}: {exc}", ctx) from None


class _NsqdCommand(click.Command):
    """A click command that first accepts Go-flag syntax (``normalise_argv``)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, normalise_argv(args, ctx))


_METAVARS = {
    Kind.STRING: "TEXT",
    Kind.INT: "INT",
    Kind.FLOAT: "FLOAT",
    Kind.DURATION: "DURATION",
    Kind.BOOL: "BOOL",
    Kind.STRING_LIST: "TEXT",
    Kind.FLOAT_LIST: "FLOAT[,FLOAT...]",
    Kind.LOG_LEVEL: "LEVEL",
    Kind.TLS_REQUIRED: "BOOL|tcp-https",
    Kind.TLS_MIN_VERSION: "VERSION",
}
# Defaults that depend on the machine: shown as what they mean, not as this host's value.
_DEFAULT_TEXT = {
    "node-id": "hash of the hostname",
    "broadcast-address": "the OS hostname",
    "data-path": "the current directory",
}


def default_text(setting: Setting, defaults: Options) -> str:
    """A setting's default as nsqd's help writes it (``1m0s``, ``true``, ``""``, ``none``)."""
    if setting.flag in _DEFAULT_TEXT:
        return _DEFAULT_TEXT[setting.flag]
    value = lmq_config.default_value(setting, defaults)
    return lmq_config.default_shown(value, duration=setting.kind is Kind.DURATION)


def _build_command() -> click.Command:
    defaults = Options()
    params: list[click.Parameter] = [
        click.Option(
            ["--config", "config"],
            metavar="FILE",
            help="path to a TOML config file (snake_case keys, as nsqd's)",
        ),
        click.Option(["--version", "version"], is_flag=True, help="print the version and exit"),
    ]
    for setting in SETTINGS:
        text = setting.help
        if setting.inert:
            text += " [no effect in lmqd]"
        # Shown by hand: click's show_default=<text> would parenthesise it.
        text += f"  [default: {default_text(setting, defaults)}]"
        params.append(
            click.Option(
                [f"--{setting.flag}", setting.param],
                metavar=_METAVARS[setting.kind],
                multiple=setting.kind in (Kind.STRING_LIST, Kind.FLOAT_LIST),
                help=text,
            )
        )
    return _NsqdCommand(
        name="lmqd",
        params=params,
        callback=_run,
        help=(
            "lmqd: an NSQ-compatible pub/sub daemon. Takes nsqd's flags, with any of Go's "
            "syntaxes: -flag value, -flag=value, --flag value, --flag=value; bool flags bare "
            "(-snappy) or with = (-snappy=false). Durations are Go durations (1m30s, 250ms)."
        ),
        context_settings={"max_content_width": 100},
    )


def _run(*, config: str | None, version: bool, **values: Any) -> None:
    if version:
        click.echo(VERSION_LINE)
        return
    flags: dict[str, str | Sequence[str]] = {}
    for setting in SETTINGS:
        value = values[setting.param]
        if value is not None and value != ():
            flags[setting.flag] = value
    try:
        file_values = lmq_config.load_toml(config) if config else {}
        resolved = lmq_config.resolve(flags, file_values, source=config or "config file")
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None

    logging_setup.configure(resolved.options)
    log.info("%s", VERSION_LINE)
    for warning in resolved.warnings():
        log.warning("%s", warning)

    # Imported here so that --help, --version and bad flags answer without loading the daemon.
    from lmqd.service import run_daemon
    from lmqd.storage.atrest import AtRestConfigError
    from lmqd.transport.tls import TLSConfigError

    try:
        run_daemon(resolved.options)
    except (TLSConfigError, AtRestConfigError) as exc:
        # Fail closed: TLS that was asked for and cannot be set up stops lmqd, in one line; so
        # does an encryption key file that cannot be used.
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        log.critical("failed to start: %s", exc)
        sys.exit(1)


main: click.Command = _build_command()
"""The ``lmqd`` console script (``python -m lmqd`` too)."""
