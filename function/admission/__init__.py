"""AdmissionReview <-> engine: the wire envelope, the review adapter, PodMutation validation."""
