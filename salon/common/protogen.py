"""Generate the Python gRPC stubs from protos/ into `salon/api/`: `python -m salon.common.protogen`.

The protos keep their own package names (`salon.chat.v1`, ...) and file paths for every language; only the
Python modules move under `salon.api` (protos/salon/chat/v1/chat.proto -> salon/api/chat/v1/chat_pb2.py), so
the generated imports between them are rewritten to that package. The generated modules are committed (so a
fresh clone imports them after install) and `tests/common/test_common_protos.py` fails when they are stale.
Output is reproducible: protoc is run from the `grpcio-tools` wheel, and the package `__init__.py` files are
written here.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO_ROOT / "protos"
DEFAULT_OUT = REPO_ROOT
API_PACKAGE = "salon.api"  # the Python package that holds the generated modules

INIT_TEXT = '"""Generated from protos/ by `python -m salon.common.protogen`. Do not edit."""\n'
# protoc writes `from salon.chat.v1 import chat_pb2 ...` for an imported proto: the module now lives in salon.api.
_PROTO_IMPORT = re.compile(r"^(from|import) salon\.(?=\w+\.v\d+\b)", re.MULTILINE)


def proto_files(proto_root: Path = PROTO_ROOT) -> list[Path]:
    return sorted(proto_root.rglob("*.proto"))


def generate(out_dir: Path = DEFAULT_OUT, proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Run protoc over every .proto under proto_root into out_dir/salon/api; return the files written."""
    import grpc_tools
    from grpc_tools import protoc  # imported here: only the generator needs grpcio-tools

    files = proto_files(proto_root)
    api_dir = out_dir / Path(*API_PACKAGE.split("."))
    written: list[Path] = []
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "protoc",
            f"-I{proto_root}",
            # grpc_tools bundles the well-known types; protoc needs them on the include path.
            f"-I{Path(grpc_tools.__file__).parent / '_proto'}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *[str(f.relative_to(proto_root)) for f in files],
        ]
        if protoc.main(args) != 0:
            raise RuntimeError("protoc failed")
        for f in files:
            # salon/chat/v1/chat.proto -> chat/v1/chat under salon/api
            rel = f.relative_to(proto_root).with_suffix("")
            rel_api = rel.relative_to(rel.parts[0])
            pkg_dir = api_dir / rel_api.parent
            pkg_dir.mkdir(parents=True, exist_ok=True)
            for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
                text = (Path(tmp) / (str(rel) + suffix)).read_text()
                target = api_dir / (str(rel_api) + suffix)
                target.write_text(_PROTO_IMPORT.sub(rf"\1 {API_PACKAGE}.", text))
                written.append(target)
            for package in [rel_api.parent, *rel_api.parent.parents]:  # chat/v1, chat, . (salon/api itself)
                init = api_dir / package / "__init__.py"
                if init not in written:
                    init.write_text(INIT_TEXT)
                    written.append(init)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory that receives salon/api/")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path.relative_to(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
