//! Deploy files: Dockerfile, compose, Kubernetes manifests, Prometheus rules and Grafana.

mod deploy_files;
mod deploy_grafana;
mod deploy_k8s;
mod deploy_pgo;
