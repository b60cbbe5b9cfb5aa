package proxy

// The request policy: which kinds of request clients may send through
// Ferry. Ferry talks to the brokers under its own identity, so without a
// policy any client that reaches Ferry could do whatever Ferry may do:
// create SCRAM users, change ACLs, quotas and broker configs. Requests are
// grouped in classes; produce, consume, groups, transactions and read-only
// Describe/List requests belong to none and are always allowed. A refused
// request is answered, never closed: everything it names carries the code
// Kafka's own authorizer gives (TOPIC_AUTHORIZATION_FAILED for the topic
// classes, CLUSTER_AUTHORIZATION_FAILED for the cluster ones), and the
// client keeps its connection.
//
// Whatever the policy allows, Kafka's internal topics are never deleted
// nor changed through Ferry (topic_refusals.go).
//
// Config changes are classified per resource: TOPIC resources are
// topic_config, BROKER, BROKER_LOGGER and CLIENT_METRICS resources (and
// types Ferry does not know) broker_config, GROUP resources belong to the
// groups and are allowed. A request mixing allowed and refused resources
// is forwarded without the refused ones, and their answers are added to the
// broker's.

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/upstream"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/valyala/bytebufferpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// requestClass is one kind of request the policy allows or refuses.
type requestClass struct {
	name    string
	allowed bool  // by default
	code    int16 // what everything a refused request names carries
}

var (
	topicAuthFailed   = kerr.TopicAuthorizationFailed.Code
	clusterAuthFailed = kerr.ClusterAuthorizationFailed.Code
)

// requestClasses are the classes and their defaults, all in one place.
// README.md's configuration section lists the APIs of each.
var requestClasses = []requestClass{
	// Applications create topics (auto-creation, Kafka Streams'
	// internal topics): allowed. Deleting topics or records and changing
	// topic configs destroy data of topics the client may not own, under
	// Ferry's identity: opt-in, as Kafka's ACLs allow nothing by default.
	{"topic_create", true, topicAuthFailed},     // CreateTopics, CreatePartitions
	{"topic_delete", false, topicAuthFailed},    // DeleteTopics
	{"topic_config", false, topicAuthFailed},    // AlterConfigs, IncrementalAlterConfigs on TOPIC resources
	{"records_delete", false, topicAuthFailed},  // DeleteRecords
	{"acl_admin", false, clusterAuthFailed},     // CreateAcls, DeleteAcls
	{"scram_admin", false, clusterAuthFailed},   // AlterUserScramCredentials
	{"quota_admin", false, clusterAuthFailed},   // AlterClientQuotas
	{"broker_config", false, clusterAuthFailed}, // AlterConfigs, IncrementalAlterConfigs on BROKER, BROKER_LOGGER, CLIENT_METRICS resources
	{"cluster_admin", false, clusterAuthFailed}, // UpdateFeatures, ElectLeaders, AlterPartitionReassignments
}

// keyClasses classifies the APIs whose every request is of one class.
// AlterPartitionReassignments (45_alter_partition_reassignments.go) is
// cluster_admin; AlterReplicaLogDirs and UnregisterBroker are not served at
// all (dispatch.go), and would be too.
var keyClasses = map[int16]string{
	int16(kmsg.CreateTopics):              "topic_create",
	int16(kmsg.CreatePartitions):          "topic_create",
	int16(kmsg.DeleteTopics):              "topic_delete",
	int16(kmsg.DeleteRecords):             "records_delete",
	int16(kmsg.CreateACLs):                "acl_admin",
	int16(kmsg.DeleteACLs):                "acl_admin",
	int16(kmsg.AlterUserSCRAMCredentials): "scram_admin",
	int16(kmsg.AlterClientQuotas):         "quota_admin",
	int16(kmsg.UpdateFeatures):            "cluster_admin",
	int16(kmsg.ElectLeaders):              "cluster_admin",
	int16(kmsg.AlterPartitionAssignments): "cluster_admin",
	int16(kmsg.AlterReplicaLogDirs):       "cluster_admin",
	int16(kmsg.UnregisterBroker):          "cluster_admin",
}

// configClass is the class of changing a config resource of type t; ""
// for GROUP resources, which belong to the groups.
func configClass(t kmsg.ConfigResourceType) string {
	switch t {
	case kmsg.ConfigResourceTypeTopic:
		return "topic_config"
	case kmsg.ConfigResourceTypeGroupConfig:
		return ""
	}
	return "broker_config"
}

// RequestClasses names the request policy's classes.
func RequestClasses() []string {
	out := make([]string, len(requestClasses))
	for i, rc := range requestClasses {
		out[i] = rc.name
	}
	return out
}

// policy holds the classes refused, each with the code its refusals carry.
type policy struct {
	refused map[string]int16
}

// newPolicy is the default policy changed by allow (classes added) and
// deny (classes taken out).
func newPolicy(allow, deny []string) (policy, error) {
	p := policy{refused: map[string]int16{}}
	byName := map[string]requestClass{}
	for _, rc := range requestClasses {
		byName[rc.name] = rc
		if !rc.allowed {
			p.refused[rc.name] = rc.code
		}
	}
	for _, n := range append(slices.Clone(allow), deny...) {
		if _, ok := byName[n]; !ok {
			return policy{}, fmt.Errorf("unknown request class %q (classes: %s)", n, strings.Join(RequestClasses(), ", "))
		}
	}
	for _, n := range allow {
		if slices.Contains(deny, n) {
			return policy{}, fmt.Errorf("request class %q is both allowed and denied", n)
		}
		delete(p.refused, n)
	}
	for _, n := range deny {
		p.refused[n] = byName[n].code
	}
	return p, nil
}

// refuses returns the code a request of class carries when the policy
// refuses it.
func (p policy) refuses(class string) (int16, bool) {
	code, ok := p.refused[class]
	return code, ok && class != ""
}

func policyMessage(class string) string {
	return "ferry: " + class + " requests are not allowed through Ferry (its request policy; see policy.allow)"
}

// enforcePolicy answers a request the policy refuses as a whole (whole).
// From a config change refused in part it takes the refused resources out,
// in kr and in the bytes forwarded, and returns part, which adds their
// answers to the broker's. Neither, for a request the policy allows.
func (s *Server) enforcePolicy(c *clientConn, req *request, kr kmsg.Request) (whole *reply, part func(*reply) *reply) {
	switch kr.(type) {
	case *kmsg.AlterConfigsRequest, *kmsg.IncrementalAlterConfigsRequest:
		return s.enforceConfigPolicy(c, req, kr)
	}
	class := keyClasses[req.hdr.Key]
	code, refused := s.policy.refuses(class)
	if !refused {
		return nil, nil
	}
	s.policyRefused(c, req, class)
	return localReply(req, errorResponse(kr, code, policyMessage(class))), nil
}

func (s *Server) policyRefused(c *clientConn, req *request, classes ...string) {
	s.metrics.refused(req.hdr.Key, reasonPolicy)
	c.logRefusal(zapcore.InfoLevel, reasonPolicy, "request refused by the request policy",
		zap.String("api", protocol.APIName(req.hdr.Key)), zap.Strings("classes", classes))
}

// configResource is one resource of a config change, as both
// AlterConfigs and IncrementalAlterConfigs name it.
type configResource struct {
	typ  kmsg.ConfigResourceType
	name string
}

func (s *Server) enforceConfigPolicy(c *clientConn, req *request, kr kmsg.Request) (*reply, func(*reply) *reply) {
	var all []configResource
	switch r := kr.(type) {
	case *kmsg.AlterConfigsRequest:
		for _, res := range r.Resources {
			all = append(all, configResource{res.ResourceType, res.ResourceName})
		}
	case *kmsg.IncrementalAlterConfigsRequest:
		for _, res := range r.Resources {
			all = append(all, configResource{res.ResourceType, res.ResourceName})
		}
	}
	refused := make([]bool, len(all))
	var answers []configAnswer
	var classes []string
	for i, res := range all {
		class := configClass(res.typ)
		if code, ok := s.policy.refuses(class); ok {
			refused[i] = true
			answers = append(answers, configAnswer{res, code, policyMessage(class)})
			if !slices.Contains(classes, class) {
				classes = append(classes, class)
			}
		}
	}
	if len(answers) == 0 {
		return nil, nil
	}
	s.policyRefused(c, req, classes...)
	if len(answers) == len(all) {
		resp := kr.ResponseKind()
		resp.SetVersion(req.hdr.Version)
		addConfigAnswers(resp, answers)
		return localReply(req, resp), nil
	}
	keep := func(i int) bool { return !refused[i] }
	switch r := kr.(type) {
	case *kmsg.AlterConfigsRequest:
		r.Resources = filterIndexed(r.Resources, keep)
	case *kmsg.IncrementalAlterConfigsRequest:
		r.Resources = filterIndexed(r.Resources, keep)
	}
	rewriteFrame(req, kr)
	return nil, func(r *reply) *reply {
		return s.addToReply(c, req, r, func(resp kmsg.Response) { addConfigAnswers(resp, answers) })
	}
}

// rewriteFrame makes the client's bytes kr as changed: the handler
// forwards them when it rewrites nothing.
func rewriteFrame(req *request, kr kmsg.Request) {
	buf := encodeRequest(req, kr)
	req.frame.B = append(req.frame.B[:0], buf.B...)
	upstream.EncodedBufs.Put(buf)
}

// configAnswer is the answer for one refused config resource.
type configAnswer struct {
	res  configResource
	code int16
	msg  string
}

func addConfigAnswers(resp kmsg.Response, answers []configAnswer) {
	for _, a := range answers {
		msg := a.msg
		switch r := resp.(type) {
		case *kmsg.AlterConfigsResponse:
			e := kmsg.NewAlterConfigsResponseResource()
			e.ErrorCode, e.ErrorMessage, e.ResourceType, e.ResourceName = a.code, &msg, a.res.typ, a.res.name
			r.Resources = append(r.Resources, e)
		case *kmsg.IncrementalAlterConfigsResponse:
			e := kmsg.NewIncrementalAlterConfigsResponseResource()
			e.ErrorCode, e.ErrorMessage, e.ResourceType, e.ResourceName = a.code, &msg, a.res.typ, a.res.name
			r.Resources = append(r.Resources, e)
		}
	}
}

func filterIndexed[T any](s []T, keep func(int) bool) []T {
	out := make([]T, 0, len(s))
	for i, e := range s {
		if keep(i) {
			out = append(out, e)
		}
	}
	return out
}

// addToReply answers with inner's answer and add's additions to it. When
// the broker's answer cannot be had, the allowed part is answered as
// upstreamFailed answers it, so the refused part is answered either way.
func (s *Server) addToReply(c *clientConn, req *request, inner *reply, add func(kmsg.Response)) *reply {
	return futureReply(req, func(ctx context.Context) (kmsg.Response, func(), error) {
		out, release, err := inner.finish(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil, err
			}
			if out, release, err = s.upstreamFailed(c, req, err).finish(ctx); err != nil {
				return nil, nil, err
			}
		}
		resp := req.kr.ResponseKind()
		err = decodeResponse(&bytebufferpool.ByteBuffer{B: out}, req.hdr.Key, req.hdr.Version, resp)
		if err != nil {
			if release != nil {
				release()
			}
			return nil, nil, err
		}
		add(resp)
		return resp, release, nil
	})
}
