"""The vendored Chakra schema (commscope.chakra_schema): the generated module matches
``et_def.proto`` field for field, and the ``.et`` framing reads back what it wrote."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest

from commscope import chakra_schema
from commscope.chakra_schema import attr_value, decode_et, encode_et, node_attrs, pb, read_et

SCHEMA_DIR = Path(chakra_schema.__file__).parent


def _proto_text() -> str:
    return (SCHEMA_DIR / "et_def.proto").read_text()


def _proto_messages(text: str) -> dict[str, dict[str, int]]:
    """``{message: {field: number}}`` of the .proto (oneof members included)."""
    out: dict[str, dict[str, int]] = {}
    for name, body in re.findall(r"message (\w+) \{(.*?)\n\}", text, flags=re.S):
        fields = re.findall(r"^\s*(?:repeated\s+)?[\w.]+\s+(\w+)\s*=\s*(\d+);", body, flags=re.M)
        out[name] = {f: int(n) for f, n in fields}
    return out


def _proto_enums(text: str) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for name, body in re.findall(r"enum (\w+) \{(.*?)\}", text, flags=re.S):
        out[name] = {v: int(n) for v, n in re.findall(r"(\w+)\s*=\s*(\d+);", body)}
    return out


def test_vendored_files_and_provenance():
    for name in ("et_def.proto", "et_def_pb2.py", "LICENSE", "PROVENANCE.md"):
        assert (SCHEMA_DIR / name).is_file(), name
    assert "Apache License" in (SCHEMA_DIR / "LICENSE").read_text()
    provenance = (SCHEMA_DIR / "PROVENANCE.md").read_text()
    assert "mlcommons/chakra" in provenance and "protoc --python_out=. et_def.proto" in provenance


def test_generated_module_matches_the_proto():
    text = _proto_text()
    messages, enums = _proto_messages(text), _proto_enums(text)
    assert {"AttributeProto", "GlobalMetadata", "Node", "IOInfo", "Tensor"} <= messages.keys()
    pool = pb.DESCRIPTOR
    assert pool.package == "ChakraProtoMsg"
    assert set(pool.message_types_by_name) == set(messages)
    for name, fields in messages.items():
        descriptor = pool.message_types_by_name[name]
        assert {f.name: f.number for f in descriptor.fields} == fields, name
    assert set(pool.enum_types_by_name) == set(enums)
    for name, values in enums.items():
        descriptor = pool.enum_types_by_name[name]
        assert {v.name: v.number for v in descriptor.values} == values, name


def _sample() -> tuple[pb.GlobalMetadata, list[pb.Node]]:
    meta = pb.GlobalMetadata(version=chakra_schema.SCHEMA_VERSION)
    meta.attr.add(name="rank", int64_val=3)
    node = pb.Node(id=0, name="allreduce", type=pb.COMM_COLL_NODE, data_deps=[])
    node.attr.add(name="comm_type", int64_val=pb.ALL_REDUCE)  # 0: still present (oneof)
    node.attr.add(name="comm_size", int64_val=1 << 33)
    node.attr.add(name="is_cpu_op", bool_val=False)
    node.attr.add(name="pg_ranks").int64_list.values.extend([0, 1])
    comp = pb.Node(id=1, name="compute", type=pb.COMP_NODE, data_deps=[0], duration_micros=7)
    return meta, [node, comp]


def test_stream_round_trip_plain_and_gzipped(tmp_path):
    meta, nodes = _sample()
    data = encode_et(meta, nodes)
    for raw in (data, gzip.compress(data)):
        meta_back, nodes_back = decode_et(raw)
        assert meta_back == meta and nodes_back == nodes
    path = tmp_path / "x.0.et"
    path.write_bytes(data)
    assert read_et(path)[1][1].duration_micros == 7
    attrs = node_attrs(read_et(path)[1][0])
    assert attrs == {"comm_type": 0, "comm_size": 1 << 33, "is_cpu_op": False, "pg_ranks": [0, 1]}
    assert attr_value(pb.AttributeProto(name="unset")) is None


def test_truncated_stream_is_an_error():
    meta, nodes = _sample()
    data = encode_et(meta, nodes)
    with pytest.raises(ValueError, match="truncated"):
        decode_et(data[:-3])
