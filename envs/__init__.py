"""Built-in environments, registered under the ``agentrl/`` namespace."""
