"""Generators and checkers run from the checkout (`python tools/NAME.py`); tests import them
as `tools.*` so they check the generator itself, not a copy of its rules."""
