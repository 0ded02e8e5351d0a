"""Multi-GPU (tensor-parallel) communication: the communicator (communicator.py) and the ranks<n> kernels."""
