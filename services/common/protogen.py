"""Generate the Python gRPC stubs from protos/ into the `salon` package: `python -m services.common.protogen`.

The generated modules are committed (so a fresh clone imports them after install) and
`tests/common/test_protos.py` fails when they are stale. Output is reproducible: protoc is run from
the `grpcio-tools` wheel, and the package `__init__.py` files are written here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO_ROOT / "protos"
DEFAULT_OUT = REPO_ROOT

INIT_TEXT = '"""Generated from protos/ by `python -m services.common.protogen`. Do not edit."""\n'


def proto_files(proto_root: Path = PROTO_ROOT) -> list[Path]:
    return sorted(proto_root.rglob("*.proto"))


def generate(out_dir: Path = DEFAULT_OUT, proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Run protoc over every .proto under proto_root; return the files written."""
    from grpc_tools import protoc  # imported here: only the generator needs grpcio-tools

    files = proto_files(proto_root)
    args = [
        "protoc",
        f"-I{proto_root}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[str(f.relative_to(proto_root)) for f in files],
    ]
    # grpc_tools bundles the well-known types; protoc needs them on the include path.
    import grpc_tools

    args.insert(2, f"-I{Path(grpc_tools.__file__).parent / '_proto'}")
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed")
    written: list[Path] = []
    for f in files:
        rel = f.relative_to(proto_root).with_suffix("")
        pkg_dir = out_dir / rel.parent
        for parent in [pkg_dir, *pkg_dir.relative_to(out_dir).parents]:
            init = out_dir / parent / "__init__.py"
            if parent != Path(".") and not init.exists():
                init.write_text(INIT_TEXT)
                written.append(init)
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
            written.append(out_dir / (str(rel) + suffix))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory that receives the `salon` package")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path.relative_to(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
