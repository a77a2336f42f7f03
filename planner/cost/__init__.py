"""Cost formulas: what a training run costs beyond one step (time to train, goodput)."""
