// Package kafkatest starts real Apache Kafka clusters for tests.
//
// Kafka comes as jars from Maven Central (see conformance/maven/pom.xml),
// resolved once into a cache directory and shared by every test binary:
// $FERRY_CACHE/kafka-<version>, or <repo root>/.cache/kafka-<version>.
// Each node of a cluster is one JVM running KRaft in combined
// broker+controller mode, listening on free loopback ports, with its own
// directory and log file.
//
// Kafka 4.4.0 is the default. WithVersion runs another broker version
// (Versions: 2.8.2, 3.6.2, 3.9.1), resolved from
// conformance/maven/broker/pom.xml into its own cache directory,
// kafka-<version>, with its own class data sharing archive; WithZooKeeper
// runs a cluster in ZooKeeper mode (before 4.0; the only mode 2.8 is run
// in): one ZooKeeper JVM beside the nodes, which are brokers only. Matrix
// lists the variants; FERRY_VERSIONS=all makes tests run all of them
// (FullMatrix).
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
//	FERRY_VERSIONS=all             run the whole version matrix (make test-versions)
package kafkatest
