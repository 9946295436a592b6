"""One subpackage per op: ``reference.py`` (pure torch), the NKI kernel, the C++ binding, and
``__init__.py`` with the public function that validates input and dispatches through the registry."""
