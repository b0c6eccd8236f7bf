"""Checks added on top of the wiring basics: link addresses, the RDMA-less port, versions."""
