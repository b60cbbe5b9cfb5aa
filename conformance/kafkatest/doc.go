// Package kafkatest starts real Apache Kafka clusters for tests.
//
// Kafka comes as jars from Maven Central (see conformance/maven/pom.xml),
// resolved once into a cache directory and shared by every test binary:
// $FERRY_CACHE/kafka-<version>, or <repo root>/.cache/kafka-<version>.
// Each node of a cluster is one JVM running KRaft in combined
// broker+controller mode, listening on free loopback ports, with its own
// directory and log file.
//
// Typical use:
//
//	func TestMain(m *testing.M) { kafkatest.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		c := kafkatest.Start(t, 3)
//		cl, _ := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...))
//		...
//	}
//
// No JVM outlives the test process: every JVM runs in its own process group
// with a parent-death signal, Close and Main kill what this process started,
// and Main (and the first New) kill JVMs left behind by an earlier test
// process that crashed, recognised by the -Dferry.kafkatest marker on their
// command line.
//
// Environment:
//
//	FERRY_CACHE                    cache directory (default <repo root>/.cache)
//	FERRY_KAFKATEST_KEEP=1         keep temporary cluster directories after Close
//	FERRY_KAFKATEST_CDS=0          do not use the class data sharing archive
//	FERRY_KAFKATEST_READY_TIMEOUT  readiness bound, a Go duration (default 90s)
package kafkatest
