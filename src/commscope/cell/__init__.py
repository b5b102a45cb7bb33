"""One sweep cell's traces: raw per-node files -> tidy per-cell tables, and loading them back."""
