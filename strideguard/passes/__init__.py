"""Graph transforms, one per module. Each reads the facts computed by
``strideguard.analysis`` and does one job."""
