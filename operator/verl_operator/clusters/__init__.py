"""GPU clusters described as files: cluster profiles and the node label keys they write."""
