"""The doors: what clients speak; one package per client surface, each a codec pair."""
