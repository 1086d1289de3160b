"""What runs the model behind the engine's `Executor` seam: the Hugging Face runner (`hf`),
paged attention, packed Linear layers, nanoserve's C++ kernels, the sampler and the loader."""
