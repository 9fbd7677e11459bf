"""What comes in off the wire, below every surface: request bodies, their budget, bounded JSON."""
