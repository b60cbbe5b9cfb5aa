// Package deploy holds what operators deploy next to Ferry: a Grafana
// dashboard (grafana/ferry-dashboard.json) and Prometheus alerting rules
// (prometheus/ferry-alerts.yml). Its test checks that every metric they use
// is one Ferry exports, and that the rules load and fire as their unit
// tests (prometheus/ferry-alerts_test.yml) say.
package deploy
