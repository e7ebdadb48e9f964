"""A small stateful streaming job and a local end-to-end demo of savepoints."""
