"""CDK constructs for nightbatch, one per concern; infra/stack.py wires them and grants access."""
