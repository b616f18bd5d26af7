"""The emergence lab: trained checkpoint families with different tokenizers.

`records` owns the lab record (`lab.json`); `text` builds the training byte stream, `tasks`
the task episodes and files, `model` the architecture and vocabulary remapping, `train` the
resumable training loop, `pipeline` the scoring and labelling of every checkpoint.
"""
