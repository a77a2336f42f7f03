"""Vectorization machinery for the columns model: string columns as codes, distinct rows
and the per-distinct-value tables broadcast back to rows."""
