package gateway

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/conformance/ferrytest"
	"github.com/ferry-gw/ferry/internal/testwait"
	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/proxy"
)

// TestPolicyAgainstKafka: with the default request policy (and topic
// config changes opted in), a SCRAM user and a broker config change are
// refused with the authorizer's code and never reach the cluster, and a
// config change naming a topic and a broker is split: Kafka applies the
// topic's part, the broker's is refused.
func TestPolicyAgainstKafka(t *testing.T) {
	c := cluster(t)
	f := ferrytest.Start(t, c.Bootstrap(), proxy.WithRequestPolicy([]string{"topic_config"}, nil))
	adm := kadm.NewClient(client(t, f.Addr))
	direct := kadm.NewClient(client(t, c.Bootstrap()))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	scram, err := adm.AlterUserSCRAMs(ctx, nil, []kadm.UpsertSCRAM{{User: "policy-mallory", Mechanism: kadm.ScramSha512, Password: "pw"}})
	if err == nil {
		err = scram["policy-mallory"].Err
	}
	if !errors.Is(err, kerr.ClusterAuthorizationFailed) {
		t.Fatalf("AlterUserScramCredentials through Ferry: %v, want CLUSTER_AUTHORIZATION_FAILED", err)
	}
	users, err := direct.DescribeUserSCRAMs(ctx, "policy-mallory")
	if err == nil && users["policy-mallory"].Err == nil {
		t.Fatalf("the SCRAM user reached Kafka: %+v", users)
	}

	createTopic(t, adm, "policy-mixed", 1, nil)
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	req.SetVersion(1)
	for _, r := range []struct {
		typ        kmsg.ConfigResourceType
		name, k, v string
	}{{kmsg.ConfigResourceTypeBroker, "0", "log.cleaner.threads", "3"}, {kmsg.ConfigResourceTypeTopic, "policy-mixed", "retention.ms", "4444444"}} {
		res := kmsg.NewIncrementalAlterConfigsRequestResource()
		res.ResourceType, res.ResourceName = r.typ, r.name
		cfg := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
		cfg.Name, cfg.Value = r.k, kmsg.StringPtr(r.v)
		res.Configs = append(res.Configs, cfg)
		req.Resources = append(req.Resources, res)
	}
	resp := kmsg.NewPtrIncrementalAlterConfigsResponse()
	resp.SetVersion(1)
	rawRoundTrip(t, f.Addr, req, resp)
	got := map[string]int16{}
	for _, r := range resp.Resources {
		got[r.ResourceName] = r.ErrorCode
	}
	if len(resp.Resources) != 2 || got["policy-mixed"] != 0 || got["0"] != kerr.ClusterAuthorizationFailed.Code {
		t.Fatalf("answer %+v; want the topic applied and broker 0 CLUSTER_AUTHORIZATION_FAILED", resp.Resources)
	}
	// Brokers apply a config change from the controller's log a moment
	// later.
	testwait.Eventually(t, 15*time.Second, "the topic's part of the mixed change reaching Kafka", func() error {
		rcs, err := direct.DescribeTopicConfigs(ctx, "policy-mixed")
		if err != nil {
			t.Fatal(err)
		}
		rc, _ := rcs.On("policy-mixed", nil)
		if v := configValue(rc, "retention.ms"); v != "4444444" {
			return fmt.Errorf("retention.ms = %q", v)
		}
		return nil
	})
	md, err := direct.BrokerMetadata(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bcs, err := direct.DescribeBrokerConfigs(ctx, md.Brokers.NodeIDs()...)
	if err != nil || len(bcs) != len(md.Brokers) {
		t.Fatalf("describing every broker's config: %d of %d, %v", len(bcs), len(md.Brokers), err)
	}
	for _, rc := range bcs {
		if v := configValue(rc, "log.cleaner.threads"); v == "3" {
			t.Fatalf("broker %s: log.cleaner.threads changed to 3; want the broker part refused", rc.Name)
		}
	}
}

func configValue(rc kadm.ResourceConfig, key string) string {
	for _, c := range rc.Configs {
		if c.Key == key {
			return c.MaybeValue()
		}
	}
	return ""
}

// rawRoundTrip sends req on a connection of its own, as it is (a client
// library would split it by resource), and reads the answer into resp.
func rawRoundTrip(t *testing.T, addr string, req kmsg.Request, resp kmsg.Response) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	b := protocol.AppendSize(nil)
	b = protocol.AppendRequestHeader(b, req, 1, "policy-test")
	b = req.AppendTo(b)
	protocol.FinishSize(b, 0)
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	var size [4]byte
	if _, err := io.ReadFull(c, size[:]); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, binary.BigEndian.Uint32(size[:]))
	if _, err := io.ReadFull(c, body); err != nil {
		t.Fatal(err)
	}
	if err := resp.ReadFrom(body[protocol.ResponseHeaderSize(req.Key(), req.GetVersion()):]); err != nil {
		t.Fatal(err)
	}
}
