// Package proxy serves Ferry's virtual Kafka cluster: it accepts client
// connections, answers the APIs that describe the cluster itself, and forwards
// everything else to the physical brokers of the active cluster, rewriting
// every field that carries physical identity.
package proxy
