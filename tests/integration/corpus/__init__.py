"""Third-party architectures (tiny configs, random weights) through the backend; the
registry is :mod:`.models`."""
