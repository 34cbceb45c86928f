"""The launch contract between the operator and ``verl-launcher`` (docs/launch-contract.md), in one place.

Both sides import this package: the operator builds a :class:`~verl_contract.launch_spec.LaunchSpec` and
writes it into the job's ConfigMap, the launcher in every Ray pod parses ``launch.json`` with the same model;
:mod:`verl_contract.gpu_product` is the one rule by which GPU product names compare. It depends on pydantic 2
only (a verl image has it), and imports neither the operator nor the launcher: the launcher zipapp that Ray
pods of an unmodified verl image run carries it next to ``verl_launcher``.
"""
