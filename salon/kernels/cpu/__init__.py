"""CPU fast paths of the kernel ops: salon.kernels.cpu.<op>.<op>_cpu, same signatures as the references."""
