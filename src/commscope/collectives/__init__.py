"""The collective ops' traffic: what each op sends to whom under each backend's algorithms
(:mod:`.traffic`), the alpha-beta step counts and bus-bandwidth factors of those algorithms
(:mod:`.ring`), the communication matrix built from them (:mod:`.matrix`), and the repair of
MoE all-to-all records from the routing table (:mod:`.moe`).

Torch-free and below the metrics, the predictor, the microbenchmark analysis and the exports,
which all take their traffic from here, so measured and predicted bytes follow one model.
"""
