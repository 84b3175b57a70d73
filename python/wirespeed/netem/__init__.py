"""The emulated cluster: hosts as network namespaces, capped links (tc htb), per-flow caps, faults."""
