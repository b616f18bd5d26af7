"""The emergence lab: trained checkpoint families with different tokenizers.

`records` owns the lab record (`lab.json`); `text` builds the training byte stream and its
arithmetic problems, `tasks` the task files, `model` the architecture and vocabulary remapping,
`train` the resumable training loop, `pipeline` the scoring and labelling of every checkpoint,
`analysis` and `report` the race between progress axes (family-level leave-one-family-out,
permutation test, refit bootstrap, the pre-registered verdict), `synthetic` race rows with a
known answer, `demo` the lineages `lstar demo` trains.
"""
