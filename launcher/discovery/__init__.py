"""Finding Macs over mDNS: the agent, its TXT records and HTTP side, browsing."""
