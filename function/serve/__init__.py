"""The webhook process: HTTP hosts, the hardened protocol, watches, TLS, the large-review process."""
