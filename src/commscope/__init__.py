"""commscope: what each parallelism strategy of distributed training does to the network."""

__version__ = "0.1.0"
