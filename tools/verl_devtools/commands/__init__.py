"""Subcommands of the ``verl-operator-dev`` CLI (see ``verl_devtools.cli``)."""
