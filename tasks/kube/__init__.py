"""Steps that touch a Kubernetes/OpenShift API: client, OLM, workloads, fan-out Jobs, locks."""
