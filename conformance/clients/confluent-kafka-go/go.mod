// The confluent-kafka-go member of the conformance client matrix, a module
// of its own so that Ferry's go.mod does not depend on it (cgo, a bundled
// librdkafka). conformance/clients/install.sh builds it.
module github.com/ferry-gw/ferry/conformance/clients/confluent-kafka-go

go 1.22

require github.com/confluentinc/confluent-kafka-go/v2 v2.6.1
