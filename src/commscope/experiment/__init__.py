"""The runner: one sweep cell on the cluster (:mod:`.cell`), torchrun on every node
(:mod:`.launch`) and what is measured beside it (:mod:`.probes`)."""
