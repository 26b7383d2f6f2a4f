"""The ``dyntta`` command. Thin: parses arguments, then calls the packages.

Each sub-command is a pair (``add_arguments(parser)``, ``run(args) -> int``) registered in
``COMMANDS``; packages keep their own command modules next to their code.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import re
import sys
import textwrap
import warnings
from typing import Callable, NoReturn

import dyntta
from dyntta.data import cli as data_cli
from dyntta.analysis import cli as analysis_cli
from dyntta.bench import cli as bench_cli
from dyntta.bench.executors import warning_printer
from dyntta.bench.results import RunFolderBusy
from dyntta.methods import available_methods, method_class
from dyntta.models import cli as models_cli


def add_methods_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verbose", "-v", action="store_true", help="show each option's default")


def plain(text: str) -> str:
    """Docstring text without reST markup: ``:class:`~a.B``` -> ``B``, ````x```` -> ``x``."""
    text = re.sub(r":\w+:`~?(?:[\w.]*\.)?([^`]+)`", r"\1", text)
    return text.replace("``", "")


def run_methods(args: argparse.Namespace) -> int:
    for name in available_methods():
        cls = method_class(name)
        fields = dataclasses.fields(cls.Config)
        summary = " ".join(plain((cls.__doc__ or "").strip().split("\n\n")[0]).split())
        print(textwrap.fill(summary, 100, initial_indent=f"{name:12s} ", subsequent_indent=" " * 13))
        if args.verbose:
            for f in fields:
                print(f"{'':12s}   {f.name} = {f.default!r}")
    return 0


Command = tuple[str, str, Callable[[argparse.ArgumentParser], None], Callable[..., int]]

COMMANDS: list[Command] = [
    ("methods", "list the registered methods", add_methods_arguments, run_methods),
    ("make-c", "build a corrupted dataset (CIFAR-10-C layout)", data_cli.add_arguments, data_cli.run),
    ("download", "fetch CIFAR-10-C, CIFAR-100-C or ImageNet-C (checksummed, resumable)",
     data_cli.add_download_arguments, data_cli.run_download),
    ("bench", "run a benchmark grid and print its table", bench_cli.add_bench_arguments,
     bench_cli.run_bench),
    ("train", "train a source model deterministically", bench_cli.add_train_arguments,
     bench_cli.run_train),
    ("report", "render tables and plots from a results file", bench_cli.add_report_arguments,
     bench_cli.run_report),
    ("refresh", "re-estimate a model's BN statistics on clean images: a new checkpoint",
     models_cli.add_arguments, models_cli.run),
    ("calibrate", "read dyn_adaptive's source weights for a model on its clean images",
     models_cli.add_calibrate_arguments, models_cli.run_calibrate),
    ("analyze", "run one of the paper's analyses: results file + figure",
     analysis_cli.add_arguments, analysis_cli.run),
]


class OneLineParser(argparse.ArgumentParser):
    """An argument parser that reports bad arguments in one line, naming where the usage is,
    instead of its usage block and that line (its sub-command parsers are of its class)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (usage: {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="dyntta", description=dyntta.__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"dyntta {dyntta.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text, add_arguments, run in COMMANDS:
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(p)
        p.set_defaults(run=run)
    return parser


OS_HINTS = {
    errno.EACCES: "no permission; choose a writable location (e.g. another --out or --cache-dir)",
    errno.EPERM: "not permitted; choose a writable location (e.g. another --out or --cache-dir)",
    errno.EROFS: "read-only file system; choose a writable location (e.g. another --out)",
    errno.ENOTDIR: "a part of this path is a file, not a folder",
    errno.EISDIR: "this is a folder; give a file name",
    errno.EEXIST: "a file is in the way of a folder of this name",
    errno.ENOSPC: "no space left on the device",
}


def os_error_message(exc: OSError) -> str:
    """One line naming the path and what is wrong with it (the library's own
    ``FileNotFoundError(message)`` carries no path and is shown as it is)."""
    if exc.filename is None:
        return str(exc)
    where = exc.filename if exc.filename2 is None else f"{exc.filename} -> {exc.filename2}"
    return f"{where}: {OS_HINTS.get(exc.errno, exc.strerror or type(exc).__name__)}"


def main(argv: list[str] | None = None) -> int:
    """Run one sub-command; bad input, file-system errors and Ctrl-C end with one line on stderr
    (exit status 2, or 130 when interrupted), never a traceback; a warning is one line too."""
    args = build_parser().parse_args(argv)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = warning_printer(f"dyntta {args.command}")
            return args.run(args)
    except (ValueError, RunFolderBusy) as exc:
        print(f"dyntta {args.command}: error: {exc}", file=sys.stderr)
    except OSError as exc:
        print(f"dyntta {args.command}: error: {os_error_message(exc)}", file=sys.stderr)
    except KeyboardInterrupt as exc:
        print(f"dyntta {args.command}: interrupted" + (f"; {exc}" if str(exc) else ""),
              file=sys.stderr)
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
