"""Generated stubs: do not edit."""
