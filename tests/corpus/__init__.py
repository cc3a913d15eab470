"""Differential corpus: every case runs eagerly and through ember.compile(fullgraph=True)."""
