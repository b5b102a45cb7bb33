"""Figures drawn from metric tables: they never compute metrics, only draw tables.

One module per subject: :mod:`.cell` (one cell over time), :mod:`.study` (across cells),
:mod:`.matrices` (communication matrices), :mod:`.scenarios` (predicted scenarios),
:mod:`.learning` (learning runs), :mod:`.bench` (microbenchmarks); :mod:`._style` holds the
canvas, colours and saving they share. Derived tables (means over repeats, CDFs, bytes per step)
come from :mod:`commscope.metrics`.
"""
