"""Nonconvex networks and their training: the networks of docs/conventions.md (:mod:`.networks`), the deep
stacks of the grokking experiments (:mod:`.deep`), the Fastfood map (:mod:`.fastfood`), spectral
tracking (:mod:`.spectral`) and the one training loop (:mod:`.trainer`)."""
