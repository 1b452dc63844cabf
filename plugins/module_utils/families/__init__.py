"""The knob families: one file each, listed by the registry (module_utils/registry.py)."""
