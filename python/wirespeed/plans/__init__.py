"""MSCCL++ execution plans: read, check, simulate, write and execute them on CPUs (docs/plans.md)."""
