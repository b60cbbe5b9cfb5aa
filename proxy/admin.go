package proxy

// Admin requests any broker can answer: KRaft brokers forward the
// controller's share themselves (CreateTopics, DeleteTopics,
// CreatePartitions, configs, ACLs, quotas, SCRAM credentials, features).
// Ferry sends them to one live broker of the active cluster and translates
// topic IDs both ways. Resources of type BROKER and BROKER_LOGGER name a
// virtual broker; they are answered by that physical broker Ferry sends to
// (an empty name, the cluster-wide default, passes as it is).
// DescribeTopicPartitions answers carry leaders and replicas: they are made
// virtual as in Metadata. Answers listing topics leave Ferry's own out
// (internal_topics.go).

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
)

const (
	resourceBroker       = 4
	resourceBrokerLogger = 8
)

func (s *Server) forwardAny(c *clientConn, req *request, kr kmsg.Request) (*reply, error) {
	return s.forwardAnyWith(c, req, kr, false, nil)
}

// forwardRest forwards rest, a copy of the client's request less what
// Ferry refused itself, and merge adds Ferry's refusals to the broker's
// answer; when nothing is left to forward (empty), Ferry answers the
// refusals alone.
func (s *Server) forwardRest(c *clientConn, req *request, rest kmsg.Request, empty bool, merge func(kmsg.Response)) (*reply, error) {
	if empty {
		resp := rest.ResponseKind()
		merge(resp)
		return localReply(req, resp), nil
	}
	return s.forwardAnyWith(c, req, rest, true, merge)
}

// forwardAnyWith is forwardAny for a request its handler changed
// (rewritten) and whose answer merge completes (Ferry's own answers for
// what it did not send), after the answer is translated.
func (s *Server) forwardAnyWith(c *clientConn, req *request, kr kmsg.Request, rewritten bool, merge func(kmsg.Response)) (*reply, error) {
	b, err := req.up.AnyBroker()
	if err != nil {
		return nil, err
	}
	if _, isAdmin := kr.(kmsg.AdminRequest); isAdmin {
		// KRaft brokers forward these to the controller themselves;
		// going to the one Metadata names saves a hop, and is required
		// by brokers that do not forward.
		if ctl := req.up.Controller(); ctl >= 0 {
			b = ctl
		}
	}
	ctx, cancel := context.WithTimeout(c.ctx, upstream.LookupTimeout)
	defer cancel()
	gen := req.state.Generation
	rewritten = s.translate(ctx, req.up, gen, kr, toPhysical) || rewritten
	names := brokerResourceNames(kr, b)
	rewritten = rewritten || names != nil

	var fix func(kmsg.Response) error
	switch kr.(type) {
	case *kmsg.CreateTopicsRequest, *kmsg.DeleteTopicsRequest, *kmsg.CreatePartitionsRequest,
		*kmsg.ElectLeadersRequest, *kmsg.AlterPartitionAssignmentsRequest:
		// The topic set or leaders changed: the next routing lookups
		// must see it.
		fix = func(resp kmsg.Response) error {
			rctx, cancel := context.WithTimeout(c.s.ctx, 10*time.Second)
			defer cancel()
			req.up.Refresh(rctx, true)
			s.translate(rctx, req.up, gen, resp, toVirtual)
			return nil
		}
	case *kmsg.DescribeTopicPartitionsRequest:
		fix = func(resp kmsg.Response) error {
			r := resp.(*kmsg.DescribeTopicPartitionsResponse)
			s.virtualTopicPartitions(req.up, r, gen)
			s.hideInternalTopicPartitions(req.up, r)
			return nil
		}
	case *kmsg.ListConfigResourcesRequest:
		if len(s.internal.names) > 0 {
			fix = func(resp kmsg.Response) error {
				s.hideInternalConfigResources(resp.(*kmsg.ListConfigResourcesResponse))
				return nil
			}
		}
	case *kmsg.DescribeLogDirsRequest:
		if len(s.internal.names) > 0 {
			fix = func(resp kmsg.Response) error {
				s.hideInternalLogDirs(resp.(*kmsg.DescribeLogDirsResponse))
				return nil
			}
		}
	case *kmsg.DescribeConfigsRequest, *kmsg.AlterConfigsRequest, *kmsg.IncrementalAlterConfigsRequest:
		if names != nil {
			fix = func(resp kmsg.Response) error {
				restoreResourceNames(resp, names)
				return nil
			}
		}
	}
	if merge != nil {
		translated := fix
		fix = func(resp kmsg.Response) error {
			if translated != nil {
				if err := translated(resp); err != nil {
					return err
				}
			}
			merge(resp)
			return nil
		}
	}
	if names != nil {
		// It names a broker resource: that broker alone answers it.
		return s.forwardTo(c, req, b, kr, rewritten, fix)
	}
	return s.forwardReachable(c, req, req.up.BrokersFrom(b), kr, rewritten, fix)
}

// forwardReachable sends the request to the first of brokers whose
// connection can be made. Nothing reached those passed over, so any
// request may move on to the next: the ones sent here are those any broker
// answers.
func (s *Server) forwardReachable(c *clientConn, req *request, brokers []int32, kr kmsg.Request, rewritten bool, fix func(kmsg.Response) error) (*reply, error) {
	err := fmt.Errorf("cluster %q: %w", req.up.Name, upstream.ErrNoBrokers)
	for _, b := range brokers {
		var r *reply
		if r, err = s.forwardTo(c, req, b, kr, rewritten, fix); err == nil {
			return r, nil
		}
	}
	return nil, err
}

// brokerResourceNames points BROKER and BROKER_LOGGER resources at the
// physical broker the request goes to and returns the names the client
// used, by position (nil when there are none).
func brokerResourceNames(kr kmsg.Request, broker int32) map[int]string {
	var names map[int]string
	set := func(i int, typ kmsg.ConfigResourceType, name *string) {
		if (typ == resourceBroker || typ == resourceBrokerLogger) && *name != "" {
			if names == nil {
				names = map[int]string{}
			}
			names[i] = *name
			*name = strconv.Itoa(int(broker))
		}
	}
	switch r := kr.(type) {
	case *kmsg.DescribeConfigsRequest:
		for i := range r.Resources {
			set(i, r.Resources[i].ResourceType, &r.Resources[i].ResourceName)
		}
	case *kmsg.AlterConfigsRequest:
		for i := range r.Resources {
			set(i, r.Resources[i].ResourceType, &r.Resources[i].ResourceName)
		}
	case *kmsg.IncrementalAlterConfigsRequest:
		for i := range r.Resources {
			set(i, r.Resources[i].ResourceType, &r.Resources[i].ResourceName)
		}
	}
	return names
}

func restoreResourceNames(resp kmsg.Response, names map[int]string) {
	switch r := resp.(type) {
	case *kmsg.DescribeConfigsResponse:
		for i := range r.Resources {
			if n, ok := names[i]; ok {
				r.Resources[i].ResourceName = n
			}
		}
	case *kmsg.AlterConfigsResponse:
		for i := range r.Resources {
			if n, ok := names[i]; ok {
				r.Resources[i].ResourceName = n
			}
		}
	case *kmsg.IncrementalAlterConfigsResponse:
		for i := range r.Resources {
			if n, ok := names[i]; ok {
				r.Resources[i].ResourceName = n
			}
		}
	}
}

func (s *Server) virtualTopicPartitions(u *upstream.Cluster, resp *kmsg.DescribeTopicPartitionsResponse, gen uint32) {
	brokers := s.virtualBrokers()
	for ti := range resp.Topics {
		t := &resp.Topics[ti]
		if t.Topic == nil {
			continue
		}
		t.TopicID = routing.VirtualTopicID(s.cfg.clusterID, *t.Topic)
		for pi := range t.Partitions {
			p := &t.Partitions[pi]
			p.LeaderEpoch = routing.VirtualEpoch(gen, p.LeaderEpoch)
			if p.LeaderID < 0 {
				p.Replicas, p.ISR = []int32{}, []int32{}
			} else {
				p.LeaderID = s.virtualLeader(u, *t.Topic, p.Partition, p.LeaderID)
				p.Replicas, p.ISR = s.replicaLanes(u, brokers, p.LeaderID, p.Replicas, p.ISR)
			}
			p.EligibleLeaderReplicas, p.LastKnownELR, p.OfflineReplicas = []int32{}, []int32{}, []int32{}
		}
	}
}
