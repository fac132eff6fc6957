"""netopt: a cross-region network and transfer optimizer for distributed training."""

__version__ = "0.1.0"

__all__ = ["__version__"]
