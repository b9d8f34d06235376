"""What a trainer process runs: the model zoo, data sets and their partitioning into shards, the training loop and evaluation."""
