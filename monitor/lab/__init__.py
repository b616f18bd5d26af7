"""The emergence lab: trained checkpoint families with different tokenizers.

`records` owns the lab record (`lab.json`); `text` builds the training byte stream and its
arithmetic problems, `tasks` the task files, `model` the architecture and vocabulary remapping,
`train` the resumable training loop, `pipeline` the scoring and labelling of every checkpoint,
`analysis` and `report` the multi-axis leave-one-family-out analysis, `demo` the lineages
`lstar demo` trains.
"""
