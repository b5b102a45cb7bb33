"""Chakra's execution-trace schema, vendored: ``et_def.proto`` of mlcommons/chakra v1.0.0 and
the Python module ``protoc`` generates from it (``et_def_pb2``), with the file framing Chakra's
own reader and writer use (``src/third_party/utils/protolib.py``: every message prefixed by its
length as a varint; a file is one ``GlobalMetadata`` and then ``Node`` messages; a reader also
takes it gzipped).

Provenance, licence and the command that made ``et_def_pb2.py``: ``PROVENANCE.md`` and
``LICENSE`` beside this file. The module is the output of protoc 3.21 (the builder-style code,
with no runtime-version check), which loads on every protobuf runtime from 4.21 to 7.x.

:func:`encode_et` / :func:`decode_et` turn messages into a ``.et`` stream and back;
:func:`read_et` reads a file; :func:`attr_value` gives the value of an ``AttributeProto``
whichever member of its ``oneof`` is set.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable, Iterator
from os import PathLike
from pathlib import Path
from typing import Any

from commscope.chakra_schema import et_def_pb2 as pb

# The schema version Chakra v1.0.0's converters write into GlobalMetadata.version.
SCHEMA_VERSION = "0.0.4"

__all__ = [
    "SCHEMA_VERSION",
    "attr_value",
    "decode_et",
    "encode_et",
    "iter_messages",
    "node_attrs",
    "pb",
    "read_et",
]


def _varint(value: int) -> bytes:
    """Base-128 varint of a non-negative length (protolib's ``_VarintBytes``)."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_et(metadata: pb.GlobalMetadata, nodes: Iterable[pb.Node]) -> bytes:
    """A ``.et`` stream: ``metadata`` then ``nodes``, each length-prefixed (protolib's
    ``encodeMessage``)."""
    parts = []
    for message in (metadata, *nodes):
        body = message.SerializeToString()
        parts += [_varint(len(body)), body]
    return b"".join(parts)


def iter_messages(data: bytes) -> Iterator[bytes]:
    """The serialized messages of a ``.et`` stream, in order (protolib's ``decodeMessage``
    framing). A truncated last message raises ``ValueError``."""
    pos, end = 0, len(data)
    while pos < end:
        length, shift = 0, 0
        while True:
            if pos >= end:
                raise ValueError("truncated length prefix in a Chakra stream")
            byte = data[pos]
            pos += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        if pos + length > end:
            raise ValueError("truncated message in a Chakra stream")
        yield data[pos : pos + length]
        pos += length


def decode_et(data: bytes) -> tuple[pb.GlobalMetadata, list[pb.Node]]:
    """``(GlobalMetadata, [Node, ...])`` of a ``.et`` stream (gzipped or not), parsed by the
    vendored schema."""
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    messages = iter_messages(data)
    first = next(messages, None)
    meta = pb.GlobalMetadata.FromString(first) if first is not None else pb.GlobalMetadata()
    return meta, [pb.Node.FromString(m) for m in messages]


def read_et(path: str | PathLike[str]) -> tuple[pb.GlobalMetadata, list[pb.Node]]:
    """:func:`decode_et` of a file."""
    return decode_et(Path(path).read_bytes())


def attr_value(attr: pb.AttributeProto) -> Any:
    """The value of an attribute, whichever ``oneof`` member holds it: a scalar, or a list for
    the ``*_list`` members; None when no member is set."""
    kind = attr.WhichOneof("value")
    if kind is None:
        return None
    value = getattr(attr, kind)
    if kind.endswith("_list"):
        return list(value.values)
    return value


def node_attrs(node: pb.Node) -> dict[str, Any]:
    """A node's attributes as ``{name: value}`` (the last one wins on a repeated name)."""
    return {a.name: attr_value(a) for a in node.attr}
