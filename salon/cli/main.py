"""The `salon` command: run the local stack, chat with it, convert the model, make certificates,
regenerate stubs, benchmark."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="salon", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("up", help="start kvstore, engine(s) and gateway on localhost", add_help=False)
    sub.add_parser("chat", help="interactive chat with the running gateway", add_help=False)
    sub.add_parser("convert", help="convert the GGUF model to the cached int8 checkpoint", add_help=False)
    sub.add_parser("certs", help="make a CA, service certificates and the stack's secrets", add_help=False)
    sub.add_parser("protos", help="regenerate the Python stubs from protos/", add_help=False)
    sub.add_parser("bench", help="replay a dialogue workload through the gateway", add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "up":
        from salon.cli.up import main as run
    elif args.command == "chat":
        from salon.cli.chat import main as run
    elif args.command == "convert":
        from salon.cli.convert import main as run
    elif args.command == "certs":
        from salon.cli.certs import main as run
    elif args.command == "protos":
        from salon.common.protogen import main as run
    else:
        from salon.cli.bench import main as run
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())
