"""The node programs' tables, built from Arrow buffers without pandas
(commscope.node.periodic, commscope.node.wire): the same rows, order, types and nulls a pandas
frame gave, read back by the orchestrator as it reads every node table (cell.parse._per_node)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet
import pytest

from commscope.cell.parse import _per_node
from commscope.contracts import WIRE_BIN_COLUMNS
from commscope.node import periodic, sockstats
from commscope.node import wire as node_wire

BIN_NS, OFFSET_NS = 100_000, 7


class _Ring:
    """What wire._table reads of a ring: its hook and its drained rows (bin, peer slot, bytes,
    packets, skbs)."""

    def __init__(self, hook: str, rows: list[tuple[int, int, int, int, int]]) -> None:
        self.hook = hook
        self._rows = np.array(rows, dtype=np.uint64).reshape(-1, 5)

    def table(self) -> np.ndarray:
        return self._rows


def test_the_wire_table_is_the_sorted_frame_pandas_gave(tmp_path: Path) -> None:
    peers = ["198.19.0.2", "198.19.0.10"]  # slot 2 sorts before slot 1 by name
    rings = [
        _Ring("ingress", [(5, 1, 1500, 1, 1), (4, 0, 60, 1, 1), (5, 2, 66, 1, 1)]),
        _Ring("egress", [(5, 2, 3000, 2, 1), (4, 1, 66, 1, 1), (5, 1, 100, 1, 1)]),
    ]
    table, totals = node_wire._table(rings, peers, BIN_NS, OFFSET_NS)
    names = np.array(["", *peers], dtype=object)
    expected = (
        pd.concat(
            pd.DataFrame(
                {
                    "t_ns": r.table()[:, 0].astype(np.int64) * BIN_NS + OFFSET_NS,
                    "hook": r.hook,
                    "peer": names[r.table()[:, 1].astype(np.int64)],
                    "bytes": r.table()[:, 2].astype(np.int64),
                    "packets": r.table()[:, 3].astype(np.int64),
                    "skbs": r.table()[:, 4].astype(np.int64),
                }
            )
            for r in rings
        )
        .sort_values(["t_ns", "hook", "peer"], kind="stable", ignore_index=True)
        .astype({"hook": "str", "peer": "str"})
    )
    assert table.column_names == WIRE_BIN_COLUMNS
    (tmp_path / "n0").mkdir()
    periodic.write_table(table, tmp_path / "n0" / "wire.parquet")
    back = _per_node(tmp_path, "wire.parquet", {"n0": 0})[0].drop(columns="node")
    pd.testing.assert_frame_equal(back, expected, check_dtype=False)
    # The dtypes pandas gives a string column read from parquet, as for the frames it wrote.
    assert back.dtypes.to_dict() == {
        "t_ns": np.int64, "hook": expected["hook"].dtype, "peer": expected["peer"].dtype,
        "bytes": np.int64, "packets": np.int64, "skbs": np.int64,
    }  # fmt: skip
    assert totals == {
        "egress": {"bytes": 3166, "packets": 4},
        "ingress": {"bytes": 1626, "packets": 3},
    }


def test_an_empty_wire_table_has_its_columns() -> None:
    table, totals = node_wire._table([_Ring("ingress", []), _Ring("egress", [])], [], 1, 0)
    assert table.num_rows == 0 and table.column_names == WIRE_BIN_COLUMNS
    assert totals == {h: {"bytes": 0, "packets": 0} for h in ("egress", "ingress")}


def test_socket_rows_keep_unsigned_counters_and_their_nulls(tmp_path: Path) -> None:
    n_info = len(sockstats.TCP_INFO_FIELDS)
    big = 2**64 - 1  # a kernel counter past int64
    rows = [
        (10, "198.19.0.1", 40000, "198.19.0.2", 29500, *([big] + [7] * (n_info - 1))),
        (20, "198.19.0.1", 40000, "198.19.0.2", 29500, *([None] * n_info)),
    ]
    (tmp_path / "n0").mkdir()
    periodic.write_table(
        periodic.rows_table(rows, sockstats.schema()), tmp_path / "n0" / "s.parquet"
    )
    back = _per_node(tmp_path, "s.parquet", {"n0": 0})[0]
    assert list(back.columns) == ["node", *sockstats.COLUMNS]
    for field in sockstats.TCP_INFO_FIELDS:
        assert back[field].dtype == pd.UInt64Dtype(), field
    assert back["rtt_us"].tolist() == [big, pd.NA]
    assert back["cwnd"].isna().tolist() == [False, True]
    assert back["src"].tolist() == ["198.19.0.1"] * 2 and back["sport"].dtype == np.int64


def test_nulls_past_the_first_bitmap_byte_and_int64_limits(tmp_path: Path) -> None:
    # 20 rows: the validity bitmap spans three bytes; every third value missing.
    values = [None if i % 3 == 0 else -(2**63) + i for i in range(20)]
    schema = pa.schema([("v", pa.int64())])
    (tmp_path / "n0").mkdir()
    periodic.write_table(
        periodic.rows_table([(v,) for v in values], schema), tmp_path / "n0" / "h.parquet"
    )
    back = pa.parquet.read_table(tmp_path / "n0" / "h.parquet").column("v").to_pylist()
    assert back == values


def test_a_column_that_does_not_fit_its_type_is_refused() -> None:
    with pytest.raises(OverflowError):
        periodic.arrow_array([2**64], pa.uint64())
    with pytest.raises(OverflowError):
        periodic.arrow_array([-1], pa.uint64())
    with pytest.raises(TypeError):
        periodic.arrow_array([1.5], pa.int64())  # no silent truncation
    with pytest.raises(TypeError):
        periodic.arrow_array(["a", None], pa.string())  # strings have no nulls here
    with pytest.raises(TypeError):  # an int64 array never wraps into uint64
        periodic.arrow_array(np.array([-1], dtype=np.int64), pa.uint64())
    with pytest.raises(TypeError):  # nor the reverse: the caller casts (wire._table does)
        periodic.arrow_array(np.array([3], dtype=np.uint64), pa.int64())
    assert periodic.arrow_array(np.array([3, 4], dtype=np.int32), pa.int64()).to_pylist() == [3, 4]


def test_an_empty_rows_table_has_its_schema() -> None:
    schema = pa.schema([("t_ns", pa.int64()), ("src", pa.string())])
    table = periodic.rows_table([], schema)
    assert table.num_rows == 0 and table.schema == schema
