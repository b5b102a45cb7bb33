"""Figures drawn from metric tables: they never compute metrics, only draw tables.

One module per subject: :mod:`.cell` (one cell over time), :mod:`.study` (across cells),
:mod:`.matrices` (communication matrices), :mod:`.scenarios` (predicted scenarios),
:mod:`.timeline` (one step per strategy, op by op, over the wire),
:mod:`.learning` (learning runs), :mod:`.bench` (microbenchmarks); :mod:`._style` holds the
canvas, colours and saving they share. Derived tables (means over repeats, CDFs, bytes per step)
come from :mod:`commscope.metrics`.
"""
