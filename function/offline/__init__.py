"""The CLI's offline programs (`castslice mutate / explain / mutations / config`) and what they run
on: manifests, Pod discovery, the YAML round trip, PodMutation files."""
