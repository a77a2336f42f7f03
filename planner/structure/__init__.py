"""What each rank holds: its GEMM shapes (linear modules per layer), the kernels and tensors a
layer launches and owns. Pure shapes and counts; no times, no bytes of memory."""
