"""Torch-free specifications: parallel plans, model configurations, link shapes, typed settings.

Everything here is plain data with validation, importable by Snakemake's DAG evaluation and by the
predictor without torch. Import from the submodules (``commscope.spec.plan``, ...).
"""
