"""The generated stubs in seawall/v1 match the protos, and the protos follow the contract rules: every
element documented, field numbers tidy, enums starting at <ENUM>_UNSPECIFIED = 0."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gen_protos.py"
PROTO_ROOT = ROOT / "protos"
PROTO_FILES = sorted((PROTO_ROOT / "seawall" / "v1").glob("*.proto"))

# Field numbers of descriptor.proto, to address elements in SourceCodeInfo.Location.path.
FILE_MESSAGE, FILE_ENUM, FILE_SERVICE = 4, 5, 6
MESSAGE_FIELD, MESSAGE_NESTED, MESSAGE_ENUM, MESSAGE_ONEOF = 2, 3, 4, 8
ENUM_VALUE, SERVICE_METHOD = 2, 2


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


def test_generated_code_is_current():
    proc = run_script("--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_check_lists_stale_files_and_the_fix(tmp_path):
    target = tmp_path / "v1"
    shutil.copytree(ROOT / "seawall" / "v1", target, ignore=shutil.ignore_patterns("__pycache__"))
    (target / "worker_pb2.py").write_text("# edited by hand\n")
    (target / "kvcache_pb2.pyi").unlink()
    (target / "old_pb2.py").write_text("")

    proc = run_script("--check", "--target", str(target))

    assert proc.returncode == 1
    assert "worker_pb2.py: differs" in proc.stderr
    assert "kvcache_pb2.pyi: missing" in proc.stderr
    assert "old_pb2.py: not generated" in proc.stderr
    assert "make protos" in proc.stderr
    assert "scheduler_pb2.py" not in proc.stderr


def test_regenerating_fixes_a_stale_directory(tmp_path):
    target = tmp_path / "v1"
    shutil.copytree(ROOT / "seawall" / "v1", target, ignore=shutil.ignore_patterns("__pycache__"))
    (target / "worker_pb2.py").write_text("# edited by hand\n")
    (target / "old_pb2_grpc.py").write_text("")

    assert run_script("--target", str(target)).returncode == 0
    proc = run_script("--check", "--target", str(target))
    assert proc.returncode == 0, proc.stderr
    assert not (target / "old_pb2_grpc.py").exists()


@pytest.fixture(scope="module")
def descriptor_set(tmp_path_factory) -> descriptor_pb2.FileDescriptorSet:
    """The protos compiled with their comments (SourceCodeInfo)."""
    out = tmp_path_factory.mktemp("descriptors") / "seawall.binpb"
    # protoc runs in its own process: grpc_tools' native module and NIXL's cannot share one
    # (importing both aborts with "munmap_chunk(): invalid pointer"), and the NIXL tests run in this one.
    proc = subprocess.run(
        [
            sys.executable, "-m", "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{_grpc_tools_protos()}",
            "--include_source_info",
            f"--descriptor_set_out={out}",
            *map(str, PROTO_FILES),
        ],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def _documented_elements(message, path, name):
    """(path, name) of a message, its fields, oneofs, nested enums and values; map entries excluded."""
    yield path, name
    for i, field in enumerate(message.field):
        yield (*path, MESSAGE_FIELD, i), f"{name}.{field.name}"
    synthetic = {field.oneof_index for field in message.field if field.proto3_optional}  # `optional` fields
    for i, oneof in enumerate(message.oneof_decl):
        if i not in synthetic:
            yield (*path, MESSAGE_ONEOF, i), f"{name}.{oneof.name}"
    for i, nested in enumerate(message.nested_type):
        if not nested.options.map_entry:
            yield from _documented_elements(nested, (*path, MESSAGE_NESTED, i), f"{name}.{nested.name}")
    for i, enum in enumerate(message.enum_type):
        yield from _enum_elements(enum, (*path, MESSAGE_ENUM, i), f"{name}.{enum.name}")


def _enum_elements(enum, path, name):
    yield path, name
    for i, value in enumerate(enum.value):
        yield (*path, ENUM_VALUE, i), f"{name}.{value.name}"


def _all_elements(file):
    for i, message in enumerate(file.message_type):
        yield from _documented_elements(message, (FILE_MESSAGE, i), message.name)
    for i, enum in enumerate(file.enum_type):
        yield from _enum_elements(enum, (FILE_ENUM, i), enum.name)
    for i, service in enumerate(file.service):
        yield (FILE_SERVICE, i), service.name
        for j, method in enumerate(service.method):
            yield (FILE_SERVICE, i, SERVICE_METHOD, j), f"{service.name}.{method.name}"


def test_protos_are_the_four_contracts(descriptor_set):
    names = [f.name for f in descriptor_set.file if f.package == "seawall.v1"]
    assert sorted(names) == [f"seawall/v1/{n}.proto" for n in ("common", "kvcache", "scheduler", "worker")]
    for file in descriptor_set.file:
        if file.package == "seawall.v1":
            assert file.syntax == "proto3", file.name


def test_every_element_has_a_comment(descriptor_set):
    undocumented = []
    for file in descriptor_set.file:
        if file.package != "seawall.v1":
            continue
        commented = {
            tuple(loc.path)
            for loc in file.source_code_info.location
            if loc.leading_comments.strip() or loc.trailing_comments.strip()
        }
        undocumented += [
            f"{file.name}: {name}" for path, name in _all_elements(file) if path not in commented
        ]
    assert not undocumented, "add a comment saying what it means and its unit:\n" + "\n".join(undocumented)


def _messages(descriptor_set):
    def walk(message, name):
        yield name, message
        for nested in message.nested_type:
            if not nested.options.map_entry:
                yield from walk(nested, f"{name}.{nested.name}")

    for file in descriptor_set.file:
        if file.package == "seawall.v1":
            for message in file.message_type:
                yield from walk(message, message.name)


def test_field_numbers_are_tidy(descriptor_set):
    """Each message numbers its fields 1..N; numbers of removed fields stay reserved, never reused."""
    for name, message in _messages(descriptor_set):
        used = {field.number for field in message.field}
        reserved = {n for r in message.reserved_range for n in range(r.start, r.end)}  # end is exclusive
        assert not used & reserved, name
        assert used | reserved == set(range(1, len(used | reserved) + 1)), f"{name}: {sorted(used)}"


def _upper_snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).upper()


def test_enums_start_unspecified_and_are_prefixed(descriptor_set):
    for file in descriptor_set.file:
        if file.package != "seawall.v1":
            continue
        for enum in file.enum_type:
            prefix = _upper_snake(enum.name) + "_"
            assert (enum.value[0].name, enum.value[0].number) == (f"{prefix}UNSPECIFIED", 0), enum.name
            for value in enum.value:
                assert value.name.startswith(prefix), value.name
            assert [v.number for v in enum.value] == list(range(len(enum.value))), enum.name


def _grpc_tools_protos() -> str:
    """Where grpc_tools keeps the well-known .proto files, found without importing it here."""
    spec = importlib.util.find_spec("grpc_tools")
    assert spec is not None and spec.submodule_search_locations
    return str(Path(next(iter(spec.submodule_search_locations))) / "_proto")
