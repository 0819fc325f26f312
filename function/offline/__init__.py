"""`castslice mutate / explain / mutations`: manifests, discovery, YAML round-trip, state files."""
