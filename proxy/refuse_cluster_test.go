package proxy

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/protocol"
)

// rawCall writes req on c and decodes its answer.
func rawCall(t *testing.T, c net.Conn, req kmsg.Request, corr int32) kmsg.Response {
	t.Helper()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	writeReq(t, c, req, corr)
	return decodeAnswer(t, req, readResp(t, c))
}

// decodeAnswer decodes b, an answer frame (header included, size not), to
// req.
func decodeAnswer(t *testing.T, req kmsg.Request, b []byte) kmsg.Response {
	t.Helper()
	resp, err := answerTo(req, b)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// answerTo decodes b, an answer frame (header included, size not), to req.
func answerTo(req kmsg.Request, b []byte) (kmsg.Response, error) {
	resp := req.ResponseKind()
	resp.SetVersion(req.GetVersion())
	if err := resp.ReadFrom(b[protocol.ResponseHeaderSize(req.Key(), req.GetVersion()):]); err != nil {
		return nil, fmt.Errorf("%s: undecodable answer: %w", kmsg.NameForKey(req.Key()), err)
	}
	return resp, nil
}

// TestClusterGoneRequestsAnsweredConnectionKept: with every broker of the
// active cluster gone, a client's requests are answered with the codes a
// Kafka client retries on (the leader, the coordinator, the controller are
// not available), Metadata from what Ferry last knew, and the connection
// stays open: nothing a client sees as a permanent failure.
func TestClusterGoneRequestsAnsweredConnectionKept(t *testing.T) {
	c := newKfake(t, 1, kfake.SeedTopics(2, "t"))
	reg := prometheus.NewRegistry()
	s, addr := startFerry(t, c.ListenAddrs(), WithRegisterer(reg))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := newClient(t, addr, kgo.DefaultProduceTopic("t"))
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("before")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	conn := dialRaw(t, addr)
	// A first request while the cluster is up, so the connection holds
	// upstream connections that then die under it.
	meta := kmsg.NewPtrMetadataRequest()
	meta.Version = 12
	name := "t"
	meta.Topics = []kmsg.MetadataRequestTopic{{Topic: &name}}
	before := rawCall(t, conn, meta, 1).(*kmsg.MetadataResponse)
	if len(before.Topics) != 1 || len(before.Topics[0].Partitions) == 0 {
		t.Fatalf("metadata before: %+v", before.Topics)
	}
	c.Close()

	t.Run("Metadata from the cache", func(t *testing.T) {
		m := rawCall(t, conn, meta, 2).(*kmsg.MetadataResponse)
		if len(m.Brokers) == 0 || m.Brokers[0].Port != before.Brokers[0].Port {
			t.Fatalf("brokers %+v, want Ferry's %+v", m.Brokers, before.Brokers)
		}
		if len(m.Topics) != 1 || len(m.Topics[0].Partitions) != len(before.Topics[0].Partitions) || m.Topics[0].TopicID != before.Topics[0].TopicID {
			t.Fatalf("topics %+v, want as before %+v", m.Topics, before.Topics)
		}
	})
	t.Run("Produce: NOT_LEADER_OR_FOLLOWER", func(t *testing.T) {
		p := kmsg.NewPtrProduceRequest()
		p.Version = 9
		p.Acks = -1
		p.TimeoutMillis = 5000
		p.Topics = []kmsg.ProduceRequestTopic{{Topic: "t", Partitions: []kmsg.ProduceRequestTopicPartition{{Partition: 0}}}}
		r := rawCall(t, conn, p, 3).(*kmsg.ProduceResponse)
		if len(r.Topics) != 1 || r.Topics[0].Topic != "t" || len(r.Topics[0].Partitions) != 1 {
			t.Fatalf("answer %+v", r.Topics)
		}
		if got := r.Topics[0].Partitions[0].ErrorCode; got != kerr.NotLeaderForPartition.Code {
			t.Fatalf("error %v, want NOT_LEADER_OR_FOLLOWER", kerr.ErrorForCode(got))
		}
	})
	t.Run("FindCoordinator: COORDINATOR_NOT_AVAILABLE", func(t *testing.T) {
		f := kmsg.NewPtrFindCoordinatorRequest()
		f.Version = 4
		f.CoordinatorKeys = []string{"g"}
		r := rawCall(t, conn, f, 4).(*kmsg.FindCoordinatorResponse)
		if len(r.Coordinators) != 1 || r.Coordinators[0].Key != "g" || r.Coordinators[0].ErrorCode != kerr.CoordinatorNotAvailable.Code {
			t.Fatalf("answer %+v", r.Coordinators)
		}
	})
	t.Run("CreateTopics: NOT_CONTROLLER", func(t *testing.T) {
		ct := kmsg.NewPtrCreateTopicsRequest()
		ct.Version = 5
		ct.Topics = []kmsg.CreateTopicsRequestTopic{{Topic: "new", NumPartitions: 1, ReplicationFactor: 1}}
		r := rawCall(t, conn, ct, 5).(*kmsg.CreateTopicsResponse)
		if len(r.Topics) != 1 || r.Topics[0].Topic != "new" || r.Topics[0].ErrorCode != kerr.NotController.Code {
			t.Fatalf("answer %+v", r.Topics)
		}
	})
	t.Run("connection still serves", func(t *testing.T) {
		av := kmsg.NewPtrApiVersionsRequest()
		av.Version = 3
		av.ClientSoftwareName, av.ClientSoftwareVersion = "raw", "1"
		if r := rawCall(t, conn, av, 6).(*kmsg.ApiVersionsResponse); r.ErrorCode != 0 || len(r.ApiKeys) == 0 {
			t.Fatalf("ApiVersions %+v", r)
		}
	})
	if n := testutil.ToFloat64(s.metrics.upFailures.WithLabelValues("Produce")); n < 1 {
		t.Errorf("ferry_upstream_failures_total{api=Produce} = %v, want ≥ 1", n)
	}
	if n := testutil.ToFloat64(s.metrics.errors.WithLabelValues("Produce")); n != 0 {
		t.Errorf("ferry_request_failures_total{api=Produce} = %v: a connection was closed", n)
	}
}
