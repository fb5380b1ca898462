"""Speed benchmarks: creditrl against peer implementations (TRL's GRPOTrainer, plain HF ``generate``)."""
