"""The fire's integration tests' helpers now live in the shared test kit
(tests/kit/queenkit.py; the fixtures in tests/conftest.py). This name is kept only for
test_hostile_settings.py, which still imports from it: a re-export, nothing defined here."""

from queenkit import *  # noqa: F401,F403
