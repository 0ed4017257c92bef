"""rdmad: keeps a node's RDMA and SR-IOV setup true to a declared state."""

__version__ = "0.1.0"
