"""What each rank spends: FLOPs, compute time per operation and per pipeline rank,
activations, model states, memory per rank, the optimizer step, adapters' costs."""
