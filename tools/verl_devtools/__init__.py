"""The development tooling of verl-operator: a local control plane with simulated and real GPU nodes, image
builds without a container engine, a KubeRay peer for benchmarks, and the demo. Not part of the product:
the ``verl_operator`` package and its image never import it (an import-linter contract checks that)."""
