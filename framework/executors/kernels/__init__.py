"""nanoserve's own CPU kernels: C++ compiled on first use with PyTorch's extension loader."""
