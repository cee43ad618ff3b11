"""The ``lmqlookupd`` command: nsqlookupd's flags, its config file, then ``LookupDaemon``.

Flags are nsqlookupd v1.3.0's (``apps/nsqlookupd/main.go``), with its names and defaults, so
command lines and config files written for nsqlookupd work unchanged:

``--tcp-address``, ``--http-address``, ``--broadcast-address``, ``--inactive-producer-timeout``,
``--tombstone-lifetime`` (Go durations: ``5m0s``, ``45s``), ``--log-level``, ``--log-prefix``,
``--config`` (a TOML file with the same names in snake_case; a duration there is a string or
an integer of milliseconds), ``--version`` and the deprecated no-op ``--verbose``.

Flag syntax is Go's ``flag`` package's, as lmqd's own CLI accepts it: ``-flag value``,
``-flag=value``, ``--flag value``, ``--flag=value``; bool flags bare (``-verbose``) or with
``=`` (``-verbose=false``). ``normalise_argv`` rewrites those into the ``--flag=value`` form
click parses.

Every failure is one line on stderr and a non-zero exit, never a traceback: a bad flag or
value is ``Error: ...`` with status 2 (usage) or 1 (value); a listener that cannot bind is
logged as nsqlookupd logs it (``FATAL: TCP listen (...) failed - Address already in use``) and
exits 1.
"""

from __future__ import annotations

import logging
import re
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import click
import trio

from lmqd import BUILT_WITH, logging_setup
from lmqd.config import ConfigError, default_shown, load_toml, parse_bool, parse_duration
from lmqd.lookupd.options import NSQLOOKUPD_COMPAT_VERSION, LookupdOptions
from lmqd.lookupd.service import LookupDaemon

__all__ = ["VERSION_LINE", "build_options", "main", "normalise_argv"]

log = logging.getLogger("lmqd.lookupd.cli")

VERSION_LINE = f"nsqlookupd v{NSQLOOKUPD_COMPAT_VERSION} (built w/{BUILT_WITH})"
"""What ``--version`` prints (nsqlookupd's shape: ``nsqlookupd v1.3.0 (built w/go1.19.8)``)."""


@attrs.frozen
class _Flag:
    name: str
    field: str
    """The ``LookupdOptions`` field; "" for a flag with no effect."""
    parse: Callable[[str], Any]
    help: str
    metavar: str = "TEXT"
    """What ``--help`` shows the value as (the names lmqd's own help uses)."""


def _level(text: str) -> str:
    logging_setup.level_from_name(text)  # ValueError naming the valid levels
    return text.lower()


FLAGS: tuple[_Flag, ...] = (
    _Flag("tcp-address", "tcp_address", str, "<addr>:<port> to listen on for TCP clients"),
    _Flag("http-address", "http_address", str, "<addr>:<port> to listen on for HTTP clients"),
    _Flag("broadcast-address", "broadcast_address", str,
          "address of this lookupd node, (default to the OS hostname)"),
    _Flag("inactive-producer-timeout", "inactive_producer_timeout_s", parse_duration,
          "duration of time a producer will remain in the active list since its last ping",
          "DURATION"),
    _Flag("tombstone-lifetime", "tombstone_lifetime_s", parse_duration,
          "duration of time a producer will remain tombstoned if registration remains",
          "DURATION"),
    _Flag("log-level", "log_level", _level,
          "set log verbosity: debug, info, warn, error, or fatal", "LEVEL"),
    _Flag("log-prefix", "log_prefix", str, "log message prefix"),
)  # fmt: skip
_BY_NAME = {flag.name: flag for flag in FLAGS}
_BY_KEY = {flag.name.replace("-", "_"): flag for flag in FLAGS}
_VALUE_FLAGS = frozenset([*_BY_NAME, "config"])
_BOOL_FLAGS = frozenset({"verbose"})
_HELP_FLAGS = frozenset({"h", "help"})
_FLAG_TOKEN = re.compile(r"--?([A-Za-z0-9][A-Za-z0-9_.-]*)(?:=(.*))?", re.DOTALL)


def normalise_argv(args: Sequence[str]) -> list[str]:
    """Rewrite Go-style arguments into ``--name=value`` (bools: ``--name=true``) for click.

    Raises ``click.NoSuchOption`` for an unknown flag, ``click.UsageError`` for a flag missing
    its value.
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
            out.append(token)  # a positional argument: click rejects it
            continue
        name, value = match.group(1), match.group(2)
        if name in _HELP_FLAGS:
            out.append("--help")
        elif name == "version":
            # Go's -version is a bool flag: -version=false is a way of not asking.
            try:
                asked = value is None or parse_bool(value)
            except ValueError as exc:
                raise click.UsageError(f"invalid value for {token}: {exc}") from None
            if asked:
                out.append("--version")
        elif name in _BOOL_FLAGS:
            out.append(f"--{name}={'true' if value is None else value}")
        elif name in _VALUE_FLAGS:
            if value is None:
                if i == len(args):
                    raise click.UsageError(f"flag needs an argument: {token}")
                value = args[i]
                i += 1
            out.append(f"--{name}={value}")
        else:
            raise click.NoSuchOption(token.partition("=")[0])
    return out


def _convert(flag: _Flag, raw: object, where: str) -> Any:
    try:
        if flag.parse is parse_duration and isinstance(raw, int) and not isinstance(raw, bool):
            return raw / 1000  # go-options: an integer duration in a config file is milliseconds
        if not isinstance(raw, str):
            raise ValueError(f"want a string, got {raw!r}")
        return flag.parse(raw)
    except ValueError as exc:
        raise ConfigError(f"invalid value {raw!r} for {where}: {exc}") from None


def build_options(
    flags: Mapping[str, str], config: Mapping[str, Any] | None = None, *, source: str = "config"
) -> LookupdOptions:
    """Options from flag values (by flag name) over config-file values (by key) over the
    defaults; ConfigError (one line) for anything invalid or unknown."""
    fields: dict[str, Any] = {}
    for key, raw in (config or {}).items():
        flag = _BY_KEY.get(key)
        if flag is None:
            if key == "verbose":
                continue
            raise ConfigError(f"unknown option {key!r} in {source}")
        fields[flag.field] = _convert(flag, raw, f"{key} in {source}")
    for name, raw in flags.items():
        flag = _BY_NAME[name]
        fields[flag.field] = _convert(flag, raw, f"--{name}")
    try:
        return LookupdOptions(**fields)
    except (ValueError, TypeError) as exc:
        raise ConfigError(str(exc)) from None


def _build_command() -> click.Command:
    defaults = LookupdOptions(broadcast_address="")
    params: list[click.Parameter] = [
        click.Option(["--config"], metavar="FILE",
                     help="path to a TOML config file (snake_case keys, as nsqlookupd's)"),
        click.Option(["--version"], is_flag=True, help="print the version and exit"),
        click.Option(["--verbose"], metavar="BOOL",
                     help="[deprecated in nsqlookupd] has no effect  [default: false]"),
    ]
    for flag in FLAGS:
        # lmqd's --help shows its defaults the same way (``lmqd.config.default_shown``).
        shown = (
            "the OS hostname"
            if flag.name == "broadcast-address"
            else default_shown(getattr(defaults, flag.field), duration=flag.parse is parse_duration)
        )
        params.append(
            click.Option(
                [f"--{flag.name}", flag.name.replace("-", "_")],
                metavar=flag.metavar,
                help=f"{flag.help}  [default: {shown}]",
            )
        )
    return click.Command(
        name="lmqlookupd",
        params=params,
        callback=_run,
        help=(
            "lmqlookupd: nsqlookupd's V1 TCP protocol and HTTP API. Takes nsqlookupd's flags, "
            "with any of Go's syntaxes: -flag value, -flag=value, --flag value, --flag=value."
        ),
        context_settings={"max_content_width": 100},
    )


def _run(*, config: str | None, version: bool, verbose: str | None, **values: Any) -> None:
    if version:
        click.echo(VERSION_LINE)
        return
    try:
        if verbose is not None:
            parse_bool(verbose)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    flags = {
        flag.name: values[flag.name.replace("-", "_")]
        for flag in FLAGS
        if values[flag.name.replace("-", "_")] is not None
    }
    try:
        file_values = load_toml(config) if config else {}
        options = build_options(flags, file_values, source=config or "config")
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    logging_setup.configure(options)
    try:
        trio.run(_serve, options)
    except OSError as exc:
        log.critical("%s", exc.strerror or exc)
        sys.exit(1)


async def _serve(options: LookupdOptions) -> None:
    daemon = LookupDaemon(options)
    daemon.bind()  # here, so that an address in use is a plain OSError, not in a group
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(daemon.run)

            async def stop_on_signal() -> None:
                async for signum in signals:
                    log.info("%s: shutting down", signal.Signals(signum).name)
                    daemon.shutdown()
                    return

            nursery.start_soon(stop_on_signal)
            # daemon.run returns after shutdown(); the signal task has returned by then.


_command = _build_command()


def main(argv: Sequence[str] | None = None) -> None:
    """The ``lmqlookupd`` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        _command.main(normalise_argv(args), prog_name="lmqlookupd", standalone_mode=False)
    except click.UsageError as exc:
        sys.stderr.write(f"Error: {exc.format_message()}\n")
        sys.exit(2)
    except click.ClickException as exc:
        sys.stderr.write(f"Error: {exc.format_message()}\n")
        sys.exit(1)
    except click.exceptions.Abort:
        sys.exit(1)
