"""protos/: generated stubs are fresh, every element is documented, buf lint passes."""

import filecmp
import shutil
import subprocess
from pathlib import Path

from google.protobuf import descriptor_pb2

from salon.common import protogen
from tests.requirements import require

REPO = Path(__file__).resolve().parents[2]


def test_generated_stubs_are_fresh(tmp_path):
    written = protogen.generate(tmp_path)
    assert written
    stale = []
    for path in written:
        rel = path.relative_to(tmp_path)
        committed = REPO / rel
        if not committed.exists() or not filecmp.cmp(path, committed, shallow=False):
            stale.append(str(rel))
    assert not stale, f"stale generated code, run `python -m salon.common.protogen`: {stale}"


def _descriptor_set(tmp_path) -> descriptor_pb2.FileDescriptorSet:
    from grpc_tools import protoc

    out = tmp_path / "set.pb"
    files = [str(f.relative_to(protogen.PROTO_ROOT)) for f in protogen.proto_files()]
    import grpc_tools

    rc = protoc.main(
        [
            "protoc",
            f"-I{protogen.PROTO_ROOT}",
            f"-I{Path(grpc_tools.__file__).parent / '_proto'}",
            "--include_source_info",
            f"--descriptor_set_out={out}",
            *files,
        ]
    )
    assert rc == 0
    fds = descriptor_pb2.FileDescriptorSet()
    fds.ParseFromString(out.read_bytes())
    return fds


def test_every_service_rpc_message_field_and_enum_value_has_a_comment(tmp_path):
    missing = []
    for f in _descriptor_set(tmp_path).file:
        comments = {tuple(loc.path): loc.leading_comments.strip() for loc in f.source_code_info.location}

        def need(path, what):
            if not comments.get(tuple(path)):
                missing.append(f"{f.name}: {what}")

        for si, svc in enumerate(f.service):
            need([6, si], svc.name)
            for mi, m in enumerate(svc.method):
                need([6, si, 2, mi], f"{svc.name}.{m.name}")
        for mi, msg in enumerate(f.message_type):
            need([4, mi], msg.name)
            for fi, fld in enumerate(msg.field):
                need([4, mi, 2, fi], f"{msg.name}.{fld.name}")
        for ei, enum in enumerate(f.enum_type):
            need([5, ei], enum.name)
            for vi, val in enumerate(enum.value):
                need([5, ei, 2, vi], f"{enum.name}.{val.name}")
    assert not missing, missing


def test_packages_are_versioned(tmp_path):
    for f in _descriptor_set(tmp_path).file:
        assert f.package.startswith("salon.") and f.package.split(".")[-1] == "v1", f.package


def _buf() -> str | None:
    candidate = REPO / "tools" / "node_modules" / ".bin" / "buf"
    return str(candidate) if candidate.exists() else shutil.which("buf")


def test_buf_lint():
    buf = _buf()
    require(buf is not None, "buf", "scripts/setup.sh installs @bufbuild/buf into tools/")
    result = subprocess.run([buf, "lint"], cwd=REPO / "protos", capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
