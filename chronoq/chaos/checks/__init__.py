"""The chaos checker's parts, one module per check (pure: a ``History`` in, findings out);
``chronoq.chaos.checker`` runs them all and keeps their public names."""
