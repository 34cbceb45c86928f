"""Subcommands of the ``verl-operator`` CLI (see ``verl_operator.cli``)."""
