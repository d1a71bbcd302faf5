"""patchset: apply, verify, wheel and export an ordered patch series against pinned bases."""

__version__ = "0.1.0"
