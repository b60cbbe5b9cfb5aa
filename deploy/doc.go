// Package deploy holds what operators deploy next to Ferry: a Grafana
// dashboard (grafana/ferry-dashboard.json), Prometheus alerting rules
// (prometheus/ferry-alerts.yml) and a Kustomize base for Kubernetes
// (kubernetes/). Its tests check that every metric the dashboard and the
// rules use is one Ferry exports, that the rules load and fire as their
// unit tests (prometheus/ferry-alerts_test.yml) say, that the repository's
// Dockerfile builds an image whose binary runs (buildah), and that the
// Kubernetes objects are valid, fit together and give Ferry a
// configuration it accepts (docs/KUBERNETES.md).
package deploy
