// Package conformance holds tests that run real clients through Ferry against
// real Apache Kafka brokers started by conformance/kafkatest.
package conformance
