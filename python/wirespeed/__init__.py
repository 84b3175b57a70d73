"""wirespeed: measure, compare and accelerate collective communication for distributed training."""

__version__ = "0.1.0"
