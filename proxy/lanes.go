package proxy

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/ferry-gw/ferry/routing"
	"github.com/ferry-gw/ferry/upstream"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Lanes: each Ferry member presents several virtual brokers ("lanes"),
// each on a port of its own (clients such as kafkajs and librdkafka merge
// brokers that share an address), and a partition's virtual leader is the lane of its
// owning member that matches the partition's physical leader. Clients keep
// one connection, one produce pipeline and one fetch per broker; with one
// virtual broker per member they would push all of a cluster's partitions
// through one pipeline and one fetch, and every request would need
// splitting across physical leaders. With lanes aligned to physical leaders
// a client's request almost always has a single upstream target (split only
// while leadership moves), and clients fetch from every physical leader in
// parallel, as they would directly.
//
// Virtual node IDs are member*laneStride + lane: stable for as long as the
// member's ID and the lane count are, whichever physical cluster is active.
// A physical broker keeps the lane it was first given.

// laneStride separates the node IDs of different members' lanes.
const laneStride = 1000

func laneNode(member int32, lane int) int32 { return member*laneStride + int32(lane) }

// virtualBrokers lists every lane of every live member.
func (s *Server) virtualBrokers() []routing.Broker {
	members := s.brokers.Brokers()
	out := make([]routing.Broker, 0, len(members)*s.lanes)
	for _, m := range members {
		for l := 0; l < s.lanes; l++ {
			out = append(out, routing.Broker{NodeID: laneNode(m.NodeID, l), Host: m.Host, Port: m.LanePort(l), Rack: m.Rack})
		}
	}
	return out
}

// virtualLeader is the virtual broker clients are told leads a partition
// whose physical leader is phys.
func (s *Server) virtualLeader(u *upstream.Cluster, topic string, partition int32, phys int32) int32 {
	return laneNode(s.brokers.Owner(topic+"\x00"+strconv.Itoa(int(partition))), u.Lane(phys, s.lanes))
}

// virtualCoordinator is the virtual broker clients are told coordinates a
// group or transactional ID whose physical coordinator is phys.
func (s *Server) virtualCoordinator(u *upstream.Cluster, key string, phys int32) int32 {
	return laneNode(s.brokers.Owner("coordinator\x00"+key), u.Lane(phys, s.lanes))
}

// replicaLanes shows a partition's physical replicas and ISR as clients
// see them: each physical broker as its lane on the member that leads the
// partition (leader, a virtual ID), in the cluster's order, so that an
// explicit assignment reads back as it was given (replicaMap maps it the
// other way). Where two replicas share a lane (fewer lanes than brokers),
// the list is filled up by replicaSet, keeping the replication factor.
func (s *Server) replicaLanes(u *upstream.Cluster, brokers []routing.Broker, leader int32, replicas, isr []int32) ([]int32, []int32) {
	member := leader / laneStride
	n := max(1, min(len(replicas), len(brokers)))
	// A few replicas each: slices, not maps (this runs for every
	// partition of every Metadata answer).
	out := make([]int32, 0, n)
	add := func(v int32) {
		if len(out) < n && !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	leaderListed := false
	for _, r := range replicas {
		v := laneNode(member, u.Lane(r, s.lanes))
		leaderListed = leaderListed || v == leader
	}
	if !leaderListed {
		add(leader)
	}
	for _, r := range replicas {
		add(laneNode(member, u.Lane(r, s.lanes)))
	}
	if len(out) < n {
		for _, v := range replicaSet(brokers, leader, n) {
			add(v)
		}
	}
	outISR := make([]int32, 0, len(isr))
	for _, r := range isr {
		if v := laneNode(member, u.Lane(r, s.lanes)); slices.Contains(out, v) && !slices.Contains(outISR, v) {
			outISR = append(outISR, v)
		}
	}
	if len(outISR) == 0 {
		outISR = append(outISR, leader)
	}
	return out, outISR
}

// replicaSet lists n virtual brokers starting with the leader: the same
// lane on the other members first, then the leader member's other lanes.
func replicaSet(brokers []routing.Broker, leader int32, n int) []int32 {
	n = max(1, min(n, len(brokers)))
	out := make([]int32, 0, n)
	out = append(out, leader)
	for _, b := range brokers {
		if len(out) == n {
			break
		}
		if b.NodeID != leader && b.NodeID%laneStride == leader%laneStride {
			out = append(out, b.NodeID)
		}
	}
	for _, b := range brokers {
		if len(out) == n {
			break
		}
		if b.NodeID != leader && b.NodeID%laneStride != leader%laneStride {
			out = append(out, b.NodeID)
		}
	}
	return out
}

// replicaMap maps the virtual brokers a client names in a replica
// assignment (CreateTopics, CreatePartitions, AlterPartitionReassignments)
// to physical brokers of the active cluster. A lane is the virtual broker
// of one physical broker, so lane l of any member stands for the one live
// physical broker whose lane is l. A lane that stands for none (more lanes
// than brokers) or for several (fewer lanes than brokers) cannot place a
// replica, and neither can an ID that is no lane of a live member.
type replicaMap struct {
	phys  map[int32]int32 // virtual → physical
	valid string          // the virtual IDs that map, for error messages
}

func (s *Server) replicaMap(u *upstream.Cluster) *replicaMap {
	byLane := map[int][]int32{}
	for b := range u.Snapshot().Brokers {
		l := u.Lane(b, s.lanes)
		byLane[l] = append(byLane[l], b)
	}
	m := &replicaMap{phys: map[int32]int32{}}
	var ids []string
	for _, vb := range s.virtualBrokers() {
		if bs := byLane[int(vb.NodeID%laneStride)]; len(bs) == 1 {
			m.phys[vb.NodeID] = bs[0]
			ids = append(ids, strconv.Itoa(int(vb.NodeID)))
		}
	}
	m.valid = strings.Join(ids, ", ")
	return m
}

// physicalAssignments maps the replicas (as replicas finds them) of every
// assignment in as, returning mapped copies; or, for the first that cannot
// be mapped, why, prefixed by where it is (where).
func physicalAssignments[A any](m *replicaMap, as []A, replicas func(*A) *[]int32, where func(int, *A) string) ([]A, string) {
	out := make([]A, len(as))
	for i := range as {
		a := as[i]
		phys, why := m.physical(*replicas(&a))
		if why != "" {
			return as, where(i, &a) + ": " + why
		}
		*replicas(&a) = phys
		out[i] = a
	}
	return out, ""
}

// assignedTopics is how a request whose topics may carry explicit replica
// assignments (CreateTopics, CreatePartitions: topics T, assignments A,
// answers R) is reached into: where a topic's assignments and an
// assignment's replicas are, where an assignment stands (for a refusal's
// message), a topic's refusal, the request with only some topics, and an
// answer with refusals added.
type assignedTopics[T, A, R any] struct {
	assignments func(*T) *[]A
	replicas    func(*A) *[]int32
	where       func(int, *A) string
	refuse      func(t *T, msg string) R
	only        func(topics []T) kmsg.Request
	addRefused  func(resp kmsg.Response, refused []R)
}

// forwardAssigned forwards a request whose topics name virtual brokers in
// explicit assignments: each assignment mapped to the physical brokers its
// lanes stand for, in a copy of the request (the client's keeps its IDs,
// for an answer in the upstream's place), and a topic whose assignment
// cannot be mapped answered by Ferry with INVALID_REPLICA_ASSIGNMENT. A
// request without assignments goes as it came.
func forwardAssigned[T, A, R any](s *Server, c *clientConn, req *request, kr kmsg.Request, topics []T, at assignedTopics[T, A, R]) (*reply, error) {
	var m *replicaMap
	var refused []R
	keep := make([]T, 0, len(topics))
	for _, t := range topics { // t is a copy: topics keep the client's IDs
		msg := ""
		if as := at.assignments(&t); len(*as) > 0 {
			if m == nil {
				m = s.replicaMap(req.up)
			}
			*as, msg = physicalAssignments(m, *as, at.replicas, at.where)
		}
		if msg == "" {
			keep = append(keep, t)
			continue
		}
		refused = append(refused, at.refuse(&t, msg))
	}
	if m == nil {
		return s.forwardAny(c, req, kr)
	}
	return s.forwardRest(c, req, at.only(keep), len(keep) == 0, func(resp kmsg.Response) {
		at.addRefused(resp, refused)
	})
}

// physical maps one partition's replicas. It returns a message saying why
// the assignment is refused (INVALID_REPLICA_ASSIGNMENT), or "".
func (m *replicaMap) physical(replicas []int32) ([]int32, string) {
	out := make([]int32, len(replicas))
	from := make(map[int32]int32, len(replicas)) // physical → the virtual ID that named it
	for i, v := range replicas {
		p, ok := m.phys[v]
		if !ok {
			return nil, fmt.Sprintf("broker %d cannot hold a replica: it is not a broker of this cluster that stands for one physical broker; valid broker IDs: %s", v, m.valid)
		}
		if prev, dup := from[p]; dup {
			if prev == v {
				return nil, fmt.Sprintf("broker %d is named twice", v)
			}
			return nil, fmt.Sprintf("brokers %d and %d are the same broker: IDs whose last three digits match are lanes of different Ferry members for one physical broker; valid broker IDs: %s", prev, v, m.valid)
		}
		from[p] = v
		out[i] = p
	}
	return out, ""
}
