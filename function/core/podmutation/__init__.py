"""PodMutation policies (CAST AI's pod mutator as a Kubernetes resource), the pure part: the spec
model, its compiled form, matching and ranking, applying, and the extended JSON Patch."""
