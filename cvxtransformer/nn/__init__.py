"""Nonconvex networks and their training: the networks of SPEC.md (:mod:`.networks`), the deep
stacks of the grokking experiments (:mod:`.deep`), the Fastfood map (:mod:`.fastfood`), spectral
tracking (:mod:`.spectral`) and the one training loop (:mod:`.trainer`)."""
