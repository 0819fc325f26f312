"""The edge to the apiserver, shared by every process (webhook, controller, certgen, doctor): the
client, its credentials, the list+watch informer that feeds the cluster view, leader election."""
