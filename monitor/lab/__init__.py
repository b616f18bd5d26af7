"""The emergence lab: families of small trained models with different tokenizers, their task
labels (`lab.json`, `monitor.lab.records`), and the analysis of which progress axis transfers
a task threshold to a held-out family best (`monitor.lab.analysis`, `monitor.lab.report`)."""
