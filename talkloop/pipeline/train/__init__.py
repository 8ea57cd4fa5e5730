"""``talkloop train`` and ``talkloop eval``: the command line every family shares, and the quality
metrics their evaluations compute. Each family's trainer and evaluation live in its own folder
(``talkloop/pipeline/models/<family>/``), named by its spec."""
