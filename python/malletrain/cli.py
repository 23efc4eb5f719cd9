"""The ``malletrain`` command line.

    malletrain version     versions of malletrain and of the torch it was built against

Each subcommand is a function ``_cmd_<name>(args) -> int`` registered in
:func:`build_parser`; the exit code is its return value (argparse itself exits
with 2 on a usage error).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _cmd_version(args: argparse.Namespace) -> int:
    import torch

    import malletrain
    from malletrain import _C

    print(f"malletrain {malletrain.__version__}")
    print(f"torch (built against) {_C.torch_version()}")
    print(f"torch (runtime) {torch.__version__}")
    if _C.torch_version() != torch.__version__:
        print(
            "warning: the runtime torch differs from the one malletrain was compiled against; "
            "rebuild with: pip install --no-build-isolation .",
            file=sys.stderr,
        )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="malletrain",
        description="Elastic data-parallel training for PyTorch.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    version = commands.add_parser(
        "version",
        help="print the versions of malletrain and torch",
        description="Print malletrain's version, the torch it was compiled against and the "
        "torch installed now.",
    )
    version.set_defaults(func=_cmd_version)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
