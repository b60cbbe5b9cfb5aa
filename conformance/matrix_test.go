package conformance

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-gw/ferry/conformance/kafkatest"
	"github.com/ferry-gw/ferry/conformance/testpki"
	"github.com/ferry-gw/ferry/proxy"
)

// The client conformance matrix: real clients (Java kafka-clients,
// librdkafka in two versions, confluent-kafka-go, kafkajs, kafka-python),
// each run as a program from clients/, produce to and consume from a
// shared 3-broker cluster through target(). Every consumer reads what every
// producer wrote, record for record, and leaves committed offsets at the
// end of the log.
//
// Needs the client tools: run clients/install.sh first. Then
//
//	go test -v ./conformance/ -run 'TestMatrix|TestTransactions|TestJavaAdmin'
//
// Subtests name the producer, codec set and reader, e.g.
// TestMatrix/kafkajs/basic/java-consumer; -short skips everything here.

func TestMain(m *testing.M) { kafkatest.Main(m) }

const (
	brokers     = 3
	partitions  = 3
	replication = 3
	// perCodec is how many records one produce run writes.
	perCodec = 100
)

// codecSets splits the codecs so that a client lacking lz4 and zstd
// (kafkajs) can still read every other producer's "basic" topic. Every
// reader reads the basic topics; the group protocol has nothing to do with
// codecs, so only each client's first protocol reads the others.
var codecSets = []struct {
	name       string
	codecs     []string
	allReaders bool
}{
	{"basic", []string{"none", "gzip", "snappy"}, true},
	{"lz4-zstd", []string{"lz4", "zstd"}, false},
}

var shared struct {
	once    sync.Once
	cluster *kafkatest.Cluster
	err     error
	// ca signs the certificate of the cluster's SASL_SSL listener
	// (SCRAM-SHA-512), named sharedSecure, beside its PLAINTEXT one.
	ca *testpki.CA
}

// sharedSecure is the shared cluster's SASL_SSL listener.
const sharedSecure = "SECURE"

// sharedCluster returns the one 3-broker cluster of this test binary,
// starting it on first use; kafkatest.Main closes it when the tests end.
func sharedCluster(t *testing.T) *kafkatest.Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("conformance: real Kafka and client programs are not run in -short mode")
	}
	shared.once.Do(func() {
		start := time.Now()
		if shared.ca, shared.err = testpki.NewCA("conformance-kafka-ca"); shared.err != nil {
			return
		}
		cfg := kafkatest.Config{Brokers: brokers, Name: "conformance"}
		kafkatest.WithSecureListener(kafkatest.Secure{Name: sharedSecure, CA: shared.ca, Mechanisms: []string{"SCRAM-SHA-512"}})(&cfg)
		shared.cluster, shared.err = kafkatest.New(cfg)
		t.Logf("started %d-broker cluster in %v", brokers, time.Since(start).Round(time.Millisecond))
	})
	if shared.err != nil {
		t.Fatalf("starting the shared cluster: %v", shared.err)
	}
	c := shared.cluster
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("cluster logs:\n%s", c.LogTail(40))
		}
	})
	return c
}

// admin returns a kadm client talking to the cluster directly (not through
// target), for ground truth.
func admin(t *testing.T, c *kafkatest.Cluster) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

func randomSuffix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// createTopic creates a 3-partition, RF 3 topic and waits until every
// partition's leader answers for it.
func createTopic(t *testing.T, adm *kadm.Client, prefix string) string {
	t.Helper()
	topic := prefix + "-" + randomSuffix()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	createReadyTopic(ctx, t, adm, topic, partitions, replication)
	return topic
}

// waitTopicReady waits until every partition of a topic just created
// answers ListOffsets: CreateTopics is answered once the controller has
// the topic, possibly before the brokers do, and a client that asks for
// its metadata then is told UNKNOWN_TOPIC_OR_PARTITION.
func waitTopicReady(ctx context.Context, t *testing.T, adm *kadm.Client, topic string, partitions int) {
	t.Helper()
	for {
		ends, err := adm.ListEndOffsets(ctx, topic)
		if err == nil {
			err = ends.Error()
		}
		if err == nil && len(ends[topic]) == partitions {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("topic %s not ready: %v", topic, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// reader is a consumer configuration of the matrix.
type reader struct {
	*client
	protocol string
}

func (r reader) String() string { return r.name + "-" + r.protocol }

// primary reports whether r uses its client's first group protocol.
func (r reader) primary() bool { return r.protocol == r.groupProtocols[0] }

func clientNamed(t *testing.T, cls []*client, name string) *client {
	t.Helper()
	for _, cl := range cls {
		if cl.name == name {
			return cl
		}
	}
	t.Fatalf("no client %q", name)
	return nil
}

func readers(cls []*client) []reader {
	var rs []reader
	for _, cl := range cls {
		for _, p := range cl.groupProtocols {
			rs = append(rs, reader{cl, p})
		}
	}
	return rs
}

func subset(sub, of []string) bool {
	for _, s := range sub {
		if !slices.Contains(of, s) {
			return false
		}
	}
	return true
}

func intersect(a, b []string) []string {
	var out []string
	for _, s := range a {
		if slices.Contains(b, s) {
			out = append(out, s)
		}
	}
	return out
}

// TestMatrix has every client produce, once per codec it supports, and
// every reader (client × group protocol) that can decode those codecs
// consume the result with a fresh group.
//
//	TestMatrix/<producer>/<codec set>/<reader>
func TestMatrix(t *testing.T) {
	c := sharedCluster(t)
	cls := clients(t)
	adm := admin(t, c)
	bootstrap := target(t, c)
	via := viaTarget(t, bootstrap)
	for _, p := range cls {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			for _, set := range codecSets {
				codecs := intersect(set.codecs, p.produceCodecs)
				if len(codecs) == 0 {
					continue
				}
				t.Run(set.name, func(t *testing.T) {
					topic := createTopic(t, adm, "m-"+p.name+"-"+set.name)
					var produced []record
					for _, codec := range codecs {
						recs := p.produce(t, bootstrap, topic, perCodec, codec)
						checkProduced(t, recs, perCodec)
						produced = append(produced, recs...)
					}
					checkDistinctOffsets(t, produced)
					for _, r := range readers(cls) {
						if !subset(codecs, r.fetchCodecs) || (!set.allReaders && !r.primary()) {
							continue
						}
						t.Run(r.String(), func(t *testing.T) {
							group := fmt.Sprintf("g-%s-%s", topic, r)
							got := r.consume(t, bootstrap, topic, group, len(produced), r.protocol)
							checkConsumed(t, got, produced)
							checkGroup(t, adm, via, group, r.protocol, topic)
						})
					}
				})
			}
		})
	}
}

// TestTransactions has each transactional producer commit half of its
// transactions and abort the other half, then checks that read_committed
// readers see exactly the committed records at their offsets, and that a
// read_uncommitted reader sees the aborted ones too. Every reader reads the
// Java producer's transactions; the other producers' are read by Java and
// by their own client.
//
//	TestTransactions/<producer>/<reader>
func TestTransactions(t *testing.T) {
	c := sharedCluster(t)
	cls := clients(t)
	adm := admin(t, c)
	bootstrap := target(t, c)
	via := viaTarget(t, bootstrap)
	const count = 200
	for _, p := range cls {
		if !p.transactions {
			continue
		}
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			topic := createTopic(t, adm, "txn-"+p.name)
			all := p.produce(t, bootstrap, topic, count, "none", "--transactional-id", "txn-"+topic)
			checkProduced(t, all, count)
			checkDistinctOffsets(t, all)
			var committed []record
			for _, r := range all {
				if !r.Aborted {
					committed = append(committed, r)
				}
			}
			if len(committed) == 0 || len(committed) == len(all) {
				t.Fatalf("want both committed and aborted records, got %d committed of %d", len(committed), len(all))
			}
			for _, r := range readers(cls) {
				if p.name != "java" && !(r.primary() && (r.name == "java" || r.name == p.name)) {
					continue
				}
				t.Run(r.String()+"-read_committed", func(t *testing.T) {
					group := fmt.Sprintf("g-%s-%s-rc", topic, r)
					got := r.consume(t, bootstrap, topic, group, len(committed), r.protocol, "--isolation", "read_committed")
					checkConsumed(t, got, committed)
					checkGroup(t, adm, via, group, r.protocol, topic)
				})
			}
			// Aborted records are in the log, hidden only by the isolation level.
			java := clientNamed(t, cls, "java")
			t.Run("java-classic-read_uncommitted", func(t *testing.T) {
				group := fmt.Sprintf("g-%s-ru", topic)
				got := java.consume(t, bootstrap, topic, group, len(all), "classic")
				checkConsumed(t, got, all)
				checkGroup(t, adm, via, group, "classic", topic)
			})
		})
	}
}

// adminReport is what `Client admin` prints.
type adminReport struct {
	Topic        string            `json:"topic"`
	Created      bool              `json:"created"`
	Partitions   int               `json:"partitions"`
	Replicas     int               `json:"replicas"`
	ConfigBefore map[string]string `json:"config_before"`
	ConfigAfter  map[string]string `json:"config_after"`
	Groups       []string          `json:"groups"`
	Deleted      bool              `json:"deleted"`
}

// TestJavaAdmin runs the Java Admin client through CreateTopics,
// DescribeTopics, DescribeConfigs, IncrementalAlterConfigs, ListGroups and
// DeleteTopics, and checks what it saw against what was asked for and
// against the cluster.
func TestJavaAdmin(t *testing.T) {
	c := sharedCluster(t)
	java := clientNamed(t, clients(t), "java")
	adm := admin(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// A group with committed offsets, for ListGroups to find.
	seedTopic := createTopic(t, adm, "admin-seed")
	group := "g-admin-" + randomSuffix()
	offsets := make(kadm.Offsets)
	offsets.Add(kadm.Offset{Topic: seedTopic, Partition: 0, At: 0, LeaderEpoch: -1})
	if resp, err := adm.CommitOffsets(ctx, group, offsets); err != nil || resp.Error() != nil {
		t.Fatalf("seeding group %s: %v %v", group, err, resp.Error())
	}

	topic := "admin-" + randomSuffix()
	// The admin run changes a topic's config and deletes it: opted in.
	out := runAdmin(t, java, target(t, c, proxy.WithRequestPolicy([]string{"topic_config", "topic_delete"}, nil)), topic)
	var rep adminReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("bad admin output %q: %v", out, err)
	}
	want := adminReport{
		Topic:        topic,
		Created:      true,
		Partitions:   partitions,
		Replicas:     replication,
		ConfigBefore: map[string]string{"retention.ms": "3600000"},
		ConfigAfter:  map[string]string{"retention.ms": "7200000", "max.message.bytes": "2097152"},
		Deleted:      true,
	}
	got := rep
	got.Groups = nil
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("admin saw\n%+v\nwant\n%+v", got, want)
	}
	if !slices.Contains(rep.Groups, group) {
		t.Errorf("ListGroups returned %q, want it to include %s", rep.Groups, group)
	}
	topics, err := adm.ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if topics.Has(topic) {
		t.Errorf("topic %s still exists in the cluster after the admin client deleted it", topic)
	}
}

// runAdmin runs `Client admin` and returns its one line of JSON.
func runAdmin(t *testing.T, java *client, bootstrap, topic string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	cmd := java.command(ctx, t, "admin", "--bootstrap", bootstrap, "--topic", topic,
		"--replication-factor", fmt.Sprint(replication))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("java admin: %v\nstderr:\n%s\nstdout:\n%s", err, tail(stderr.String(), 4000), stdout.String())
	}
	t.Logf("java admin: %v", time.Since(start).Round(time.Millisecond))
	return bytes.TrimSpace(stdout.Bytes())
}
