"""How code runs on a machine: devices, OpenMP threads, the torchrun world, precision, torch.compile,
CUDA graphs and the memory check. Nothing here knows about training, scoring or runs."""
