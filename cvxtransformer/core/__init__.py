"""The convex core: losses, regularisers, programs, problems, certificates, reductions."""
