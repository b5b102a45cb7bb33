"""Programs the runner starts on every node: ``python -m commscope.node.sampler`` and
``python -m commscope.node.sockstats``.

They run beside the training ranks, so they start fast and import nothing of commscope above
:mod:`commscope.contracts`; the runner (:mod:`commscope.experiment.probes`) starts and stops them.
"""
