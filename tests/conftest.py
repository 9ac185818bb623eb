"""pytest configuration: the repository root on sys.path for `tests.helpers`."""
