"""Reaching the hosts: ssh, reachability, probing, snapshots, and which hosts a command names."""
