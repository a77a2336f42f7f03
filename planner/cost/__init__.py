"""What each rank spends: FLOPs, compute time per operation and per pipeline rank,
activations, model states, memory per rank, the optimizer step, adapters' costs — and what
a whole run costs beyond one step (time to train, energy, goodput under failures)."""
