"""A toy kernel family, laid out as a real one (docs/adding_a_kernel.md walks through it).

tests/test_families.py runs every registry check on it next to the package's families, so the template
itself is tested: kernel.py (spec + TileLang builder), ops.py (host op), reference.py, family.py.
It is deliberately NOT registered with the package (`register_family`): the planner and warmup of a
real install must never see it.
"""
