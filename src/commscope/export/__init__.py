"""Exports of one measured cell for other tools.

* :mod:`~commscope.export.perfetto`: Chrome Trace Event JSON for Perfetto / ``chrome://tracing``
  (a compute track and a communication track per rank, ranks grouped by node);
* :mod:`~commscope.export.chakra`: Chakra execution traces (``.et``, written through
  mlcommons/chakra's ``et_def.proto``, vendored in :mod:`~commscope.chakra_schema`), one
  file per rank, that ASTRA-sim 2.x runs as written, with the rest of ASTRA-sim's input set
  beside them (:mod:`~commscope.export.astrasim`: what each op becomes, communicator groups,
  network, system and memory configs, the command);
* :mod:`~commscope.export.astra`: the ASTRA-sim 1.0 text workload (one layer per line), with
  the Chakra export's comm types and sizes;
* :mod:`~commscope.export.flows`: a flow list (src, dst, bytes, start, dependencies) from the
  traffic model :func:`commscope.collectives.traffic.op_destinations`;
* :mod:`~commscope.export.cell`: :func:`export_cell` writes all of them for one cell;
* :mod:`~commscope.export.records`: the ops as plain records per rank, shared by all of them.

Every export that places compute between ops (Chakra, ASTRA-sim text) takes one rank's timeline
from :func:`commscope.cell.timeline.rank_timeline`, so all count compute the same way (its
module docstring defines compute time).
"""

from __future__ import annotations

from commscope.cell.timeline import PHASES
from commscope.export.astra import (
    AstraLayer,
    AstraWorkload,
    astra_workload,
    parse_astra_text,
    to_astra_text,
    write_astra_text,
)
from commscope.export.cell import export_cell
from commscope.export.chakra import to_chakra, write_chakra
from commscope.export.flows import FLOW_COLUMNS, to_flows, write_flows_csv
from commscope.export.perfetto import to_chrome_trace, write_chrome_trace
from commscope.export.records import op_records, rank_nodes

__all__ = [
    "FLOW_COLUMNS",
    "PHASES",
    "AstraLayer",
    "AstraWorkload",
    "astra_workload",
    "export_cell",
    "op_records",
    "parse_astra_text",
    "rank_nodes",
    "to_astra_text",
    "to_chakra",
    "to_chrome_trace",
    "to_flows",
    "write_astra_text",
    "write_chakra",
    "write_chrome_trace",
    "write_flows_csv",
]
