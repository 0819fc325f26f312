"""Programs that act on a cluster through the kubeconfig (or the Pod's ServiceAccount): ``castslice
certgen`` (the serving certificate without cert-manager) and ``castslice doctor``."""
